//! Test plugin: not a handler at all.
//!
//! A plain `fn main` binary. Built for `wasm32-wasip2` it is a
//! `wasi:cli/command` component: a valid component of another world, which the
//! runtime must refuse to load as a Sluice plugin.
//!
//! Config keys: none.

fn main() {
    println!("hello");
}
