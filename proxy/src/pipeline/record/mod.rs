//! The record phase: what a request came to, counted in the metrics and written to the audit
//! log before the agent sees the end of its response.

mod held_body;

pub(crate) use held_body::*;
