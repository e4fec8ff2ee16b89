//! The `forkpool` command.

#[allow(dead_code)]
mod bench;

fn main() {
    println!("forkpool {}", env!("CARGO_PKG_VERSION"));
}
