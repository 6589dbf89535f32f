//! stackprobe: kernel probe → shared event type → collector → pure model →
//! views. `probes` talks to the kernel, `model` holds the numbers, `view`
//! renders them, `cmd` wires them together.

pub mod cli;
pub mod cmd;
pub mod collector;
pub mod export;
pub mod model;
pub mod probes;
pub mod procfs;
pub mod sink;
pub mod view;
