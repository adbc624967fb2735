//! Pausing the tracked tree and letting it go: backpressure under ring
//! pressure, the guardian that resumes the tree when memtrail dies, and stop
//! ownership on real processes (`cargo test --test pressure`).
//!
//! Not here: `reliability`, whose captures measure what a parent sees of
//! pauses and run one at a time, alone in their binary (another storm
//! beside them starves the pressure coordinator they observe).

#[path = "../support/mod.rs"]
mod support;

mod guardian;
mod pressure;
mod stops;
