//! Views render the model's reports; they compute nothing of their own.

pub mod json;
pub mod text;
pub mod tui;
