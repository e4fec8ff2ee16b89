//! The `forkpool` command.

fn main() {
    println!("forkpool {}", env!("CARGO_PKG_VERSION"));
}
