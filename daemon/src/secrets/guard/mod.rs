//! The leak guard: a secret value, or a placeholder of a secret the deciding rule does not
//! bind, never leaves in a request, and a value never reaches the agent in a response.
//!
//! * `matcher`: one automaton over every value (and its encoded forms) and placeholder;
//!   `stream`: it applied across body chunks, holding a tail whose length never depends on
//!   the bytes;
//! * `scan`: a request head (host, headers, URL, trailers); `scan_body`: a request body as it
//!   streams upstream;
//! * `redact`: response headers and bodies, values replaced or the body cut short;
//!   `aws_fields`: credentials an AWS response hands out, redacted.

pub(crate) mod aws_fields;
pub(crate) mod matcher;
pub(crate) mod redact;
pub(crate) mod scan;
pub(crate) mod scan_body;
pub(crate) mod stream;
