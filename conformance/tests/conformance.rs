//! `cargo test` entry: one test per device × conformance case.

fn main() {
    let args = libtest_mimic::Arguments::from_args();
    libtest_mimic::run(&args, unirt_conformance::trials()).exit();
}
