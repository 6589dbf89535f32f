//! TCP in model terms, one file per concern: the sockets as the kernel's
//! iterator shows them (`sockets`); a link, as the kernel keys it and as a
//! row names it (`key`), and what it counts (`counts`); what one look at
//! the kernel finds, the walk of the sockets included (`snapshot`); and
//! the table that turns the kernel's running totals into rows (`links`),
//! naming each owner by its role (`role_names`); connections lost at a
//! listener's full queue, from the kernel's running totals (`lost`).
//!
//! The probes fill these types from the kernel's maps and the iterator;
//! the report's TCP part (`report::tcp`) renders the table.

pub mod counts;
pub mod key;
pub mod links;
pub mod lost;
mod role_names;
pub mod snapshot;
pub mod sockets;
