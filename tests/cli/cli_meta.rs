//! What memtrail says about itself (issue 16): `--version` with the commit
//! and the kernel's BPF features, shell completions, man pages.

use std::io::Write;
use std::process::{Command, Stdio};

use crate::support::MEMTRAIL;

/// `memtrail ARGS`: exit code, stdout, stderr.
fn run(args: &[&str]) -> (Option<i32>, String, String) {
    let out = Command::new(MEMTRAIL)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run memtrail");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Check that `--version` names the release and the commit built from
/// (the checkout's HEAD) and lists every kernel BPF feature memtrail needs
/// as found on this machine, and `-V` the first line only.
#[test]
fn cli_meta_version_names_commit_and_bpf_features() {
    let head = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("run git");
    let head = String::from_utf8_lossy(&head.stdout).trim().to_owned();
    let first = format!("memtrail {} (commit {head})", env!("CARGO_PKG_VERSION"));

    let (code, stdout, stderr) = run(&["--version"]);
    assert_eq!(code, Some(0), "{stderr}");
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines[0], first);
    assert_eq!(lines[1], "kernel BPF features memtrail needs:");
    let features: Vec<Vec<&str>> = lines[2..]
        .iter()
        .map(|l| l.rsplitn(2, ' ').collect())
        .collect();
    let names: Vec<&str> = features.iter().map(|f| f[1].trim()).collect();
    assert_eq!(
        names,
        [
            "BTF",
            "ring buffers",
            "uprobe_multi links",
            "tp_btf programs",
            "task storage",
            "bpf_send_signal",
            "bpf_find_vma",
            "bpf_send_signal_task",
        ]
    );
    assert!(features.iter().all(|f| f[0] == "found"), "{stdout}");

    let (code, stdout, _) = run(&["-V"]);
    assert_eq!(code, Some(0));
    assert_eq!(stdout, format!("{first}\n"));
}

/// Check that `memtrail completions SHELL` prints a script for each shell
/// clap_complete knows that covers the subcommands and their flags, and
/// that bash and zsh accept the scripts for bash and zsh as syntax.
#[test]
fn cli_meta_completions_for_each_shell() {
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let (code, stdout, stderr) = run(&["completions", shell]);
        assert_eq!(code, Some(0), "{shell}: {stderr}");
        for word in ["run", "report", "pressure-timeout", "report-output"] {
            assert!(stdout.contains(word), "{shell}: no {word}");
        }
    }
    let (_, bash, _) = run(&["completions", "bash"]);
    assert!(bash.contains("complete -F _memtrail"), "{bash}");
    let mut check = Command::new("bash")
        .arg("-n")
        .stdin(Stdio::piped())
        .spawn()
        .expect("run bash");
    check
        .stdin
        .take()
        .expect("stdin")
        .write_all(bash.as_bytes())
        .expect("write");
    assert!(check.wait().expect("wait").success(), "bash -n failed");
    let (code, _, stderr) = run(&["completions", "no-such-shell"]);
    assert_eq!(code, Some(2), "{stderr}");
}

/// Check that `memtrail man` prints memtrail(1) and `memtrail man run`
/// memtrail-run(1), in roff, with the flags documented.
#[test]
fn cli_meta_man_pages() {
    let (code, page, stderr) = run(&["man"]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(page.contains(".TH memtrail 1"), "{page}");
    assert!(page.contains("memtrail\\-run"), "{page}");
    let (code, page, stderr) = run(&["man", "run"]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(page.contains(".TH memtrail-run 1"), "{page}");
    assert!(page.contains("\\-\\-pressure\\-timeout"), "{page}");
    assert!(page.contains("\\-\\-force"), "{page}");
    let (code, _, _) = run(&["man", "nothing"]);
    assert_eq!(code, Some(2));
}

/// What in `text` reads as rustdoc rather than help for people: intra-doc
/// links (`` [`X`] ``, `[X]`, `[x](y)`) and Rust paths (`Self::`,
/// `crate::`). Brackets clap writes itself (`[default: …]`, `[env: …]`,
/// `[possible values: …]`, an optional `[FLAG]` or `[VALUE]` of a usage
/// line) are not.
fn rustdoc_isms(text: &str, placeholders: &[String]) -> Vec<String> {
    let mut found: Vec<String> = ["[`", "`]", "](", "::"]
        .into_iter()
        .filter(|pat| text.contains(pat))
        .map(|pat| format!("{pat:?}"))
        .collect();
    let mut rest = text;
    while let Some(open) = rest.find('[') {
        let Some(len) = rest[open..].find(']') else {
            break;
        };
        let inside = &rest[open + 1..open + len];
        let clap_wrote = ["default: ", "possible values: ", "env: ", "aliases: "]
            .iter()
            .any(|p| inside.starts_with(p))
            || inside.starts_with('-')
            || placeholders.iter().any(|p| p == inside);
        if !clap_wrote {
            found.push(format!("[{inside}]"));
        }
        rest = &rest[open + len..];
    }
    found
}

/// The names of every subcommand, as typed (`bench`, ...), and every value
/// name clap may put in brackets.
fn commands_and_placeholders() -> (Vec<String>, Vec<String>) {
    let cli = <memtrail::internals::cli::Cli as clap::CommandFactory>::command();
    let subcommands = cli
        .get_subcommands()
        .map(|c| c.get_name().to_owned())
        .filter(|name| name != "help")
        .collect();
    let mut placeholders = vec!["OPTIONS".to_owned(), "COMMAND".to_owned()];
    for cmd in std::iter::once(&cli).chain(cli.get_subcommands()) {
        for arg in cmd.get_arguments() {
            placeholders.extend(
                arg.get_value_names()
                    .into_iter()
                    .flatten()
                    .map(|v| v.to_string()),
            );
        }
    }
    (subcommands, placeholders)
}

/// Check that no help text (`-h` and `--help` of memtrail and of every
/// subcommand) and no man page shows rustdoc (issue 26: `run --help` and
/// the man page said "Per CPU on machines with at least [`AUTO_PER_CPU`]
/// CPUs online"), and that `--event-rings auto` names the number of CPUs.
#[test]
fn cli_meta_help_has_no_rustdoc() {
    let (subcommands, placeholders) = commands_and_placeholders();
    assert!(subcommands.len() >= 8, "{subcommands:?}");
    let mut texts: Vec<(String, String)> = Vec::new();
    for flag in ["-h", "--help"] {
        let (code, stdout, stderr) = run(&[flag]);
        assert_eq!(code, Some(0), "{stderr}");
        texts.push((format!("memtrail {flag}"), stdout));
        for sub in &subcommands {
            let (code, stdout, stderr) = run(&[sub, flag]);
            assert_eq!(code, Some(0), "{sub} {flag}: {stderr}");
            texts.push((format!("memtrail {sub} {flag}"), stdout));
        }
    }
    // roff: fonts and escaped dashes.
    let plain = |page: String| {
        page.replace("\\fB", "")
            .replace("\\fI", "")
            .replace("\\fR", "")
            .replace("\\-", "-")
    };
    let (code, page, _) = run(&["man"]);
    assert_eq!(code, Some(0));
    texts.push(("memtrail man".to_owned(), plain(page)));
    for sub in &subcommands {
        let (code, page, stderr) = run(&["man", sub]);
        if code == Some(2) && stderr.contains("invalid value") {
            continue; // completions and man have no page of their own
        }
        assert_eq!(code, Some(0), "man {sub}: {stderr}");
        texts.push((format!("memtrail man {sub}"), plain(page)));
    }
    for (what, text) in &texts {
        let found = rustdoc_isms(text, &placeholders);
        assert!(found.is_empty(), "{what} shows rustdoc: {found:?}\n{text}");
    }
    let (_, help, _) = run(&["run", "--help"]);
    assert!(
        help.contains("Per CPU on machines with at least 4 CPUs online"),
        "{help}"
    );
}

/// `memtrail --version` as `nobody`, from a copy of the binary holding the
/// file capabilities `caps` (none if empty): its feature lines.
fn version_as_nobody(caps: &str) -> Vec<(String, String)> {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let exe = dir.path().join("memtrail");
    // Copied by cp, not here: a file this process held open for writing
    // could be inherited by a child another test forks meanwhile, and
    // executing it would fail (ETXTBSY) until that child execs.
    let cp = Command::new("cp")
        .arg(MEMTRAIL)
        .arg(&exe)
        .status()
        .expect("run cp");
    assert!(cp.success(), "cp memtrail");
    std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    if !caps.is_empty() {
        let setcap = Command::new("setcap")
            .arg(caps)
            .arg(&exe)
            .output()
            .expect("run setcap (apt-get install libcap2-bin)");
        assert!(setcap.status.success(), "setcap {caps}");
    }
    let out = Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--inh-caps=-all",
        ])
        .arg(&exe)
        .arg("--version")
        .env_clear()
        .current_dir("/")
        .stdin(Stdio::null())
        .output()
        .expect("run setpriv");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{caps}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
        .lines()
        .skip(2)
        .map(|l| {
            let (name, found) = l.trim().split_at(21);
            (name.trim().to_owned(), found.to_owned())
        })
        .collect()
}

/// Check that `--version` run without the capabilities a BPF probe needs
/// says the feature is unknown and which capabilities would tell, rather
/// than MISSING (issue 26: "ring buffers MISSING" as an unprivileged user)
/// or found (a helper libbpf could not probe counted as supported), while
/// what BTF tells (readable by anyone) is still found; and that CAP_BPF
/// with CAP_PERFMON finds everything.
#[test]
fn cli_meta_version_unprivileged_says_unknown() {
    let maps = "unknown (needs CAP_BPF to probe)";
    let programs = "unknown (needs CAP_BPF and CAP_PERFMON to probe)";
    let lines = version_as_nobody("");
    let expected = [
        ("BTF", "found"),
        ("ring buffers", maps),
        ("uprobe_multi links", "found"),
        ("tp_btf programs", "found"),
        ("task storage", maps),
        ("bpf_send_signal", programs),
        ("bpf_find_vma", programs),
        ("bpf_send_signal_task", "found"),
    ];
    let as_strings = |e: &[(&str, &str)]| -> Vec<(String, String)> {
        e.iter()
            .map(|(n, f)| ((*n).to_owned(), (*f).to_owned()))
            .collect()
    };
    assert_eq!(lines, as_strings(&expected));

    let lines = version_as_nobody("cap_bpf+ep");
    let expected: Vec<(&str, &str)> = expected
        .iter()
        .map(|&(n, f)| (n, if f == maps { "found" } else { f }))
        .collect();
    assert_eq!(lines, as_strings(&expected));

    let lines = version_as_nobody("cap_bpf,cap_perfmon+ep");
    assert!(lines.iter().all(|(_, f)| f == "found"), "{lines:?}");
}
