//! The log filter from `AGENSHIELD_LOG` (else `RUST_LOG`): checked, never a silent mistake.
//!
//! `tracing`'s filter syntax reads any word it does not know as a module name, so
//! `AGENSHIELD_LOG=verbose` parses, enables the module `verbose` (which does not exist) and
//! nothing else: every line of ours, errors included, is silenced. A filter that does not
//! parse, or that enables not even our errors, is refused with examples of the right form;
//! `off` is the one way to ask for silence.

use tracing_subscriber::EnvFilter;

/// Examples of filters that work, for the error messages.
const EXAMPLES: &str = "e.g. info, debug, warn, agenshield_proxy=debug,h2=info (a level, or \
     TARGET=LEVEL pairs separated by commas; levels: error, warn, info, debug, trace, off)";

/// What is logged with no variable set. rustls warns about client quirks (an IP literal sent
/// as SNI) once per connection.
const DEFAULT: &str = "info,rustls=error";

/// A log filter refused: the variable's name and value, and why.
#[derive(Debug, thiserror::Error)]
pub enum FilterError {
    #[error("{var}={value:?} is not a log filter ({source}); {EXAMPLES}")]
    Unparsable {
        var: String,
        value: String,
        source: tracing_subscriber::filter::ParseError,
    },
    /// Parses, but silences every line of ours; `read_as`: the words taken for module names.
    #[error(
        "{var}={value:?} enables no log line of agenshield, not even errors{}; {EXAMPLES}; \
         `off` silences everything",
        read_as_modules(read_as)
    )]
    Silent {
        var: String,
        value: String,
        read_as: Vec<String>,
    },
}

/// ` ("verbose" read as a module name, not a level)`, or nothing for no words.
fn read_as_modules(words: &[String]) -> String {
    match words {
        [] => String::new(),
        w => format!(
            " ({} read as a module name, not a level)",
            w.iter()
                .map(|w| format!("{w:?}"))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

/// The filter `var` (a variable's name, for the messages) = `value` asks for.
pub fn parse(var: &str, value: &str) -> Result<EnvFilter, FilterError> {
    let filter = EnvFilter::try_new(value).map_err(|source| FilterError::Unparsable {
        var: var.to_owned(),
        value: value.to_owned(),
        source,
    })?;
    if value.trim().eq_ignore_ascii_case("off")
        || enables_our_errors(value)
        || names_a_module_of_ours(value)
    {
        return Ok(filter);
    }
    let read_as = value
        .split(',')
        .map(str::trim)
        .filter(|d| !d.is_empty() && !d.contains(['=', '[']))
        .map(str::to_owned)
        .collect();
    Err(FilterError::Silent {
        var: var.to_owned(),
        value: value.to_owned(),
        read_as,
    })
}

/// The filter from the environment: `AGENSHIELD_LOG`, else `RUST_LOG`, else the default.
pub fn from_env() -> Result<EnvFilter, FilterError> {
    match ["AGENSHIELD_LOG", "RUST_LOG"]
        .iter()
        .find_map(|var| std::env::var(var).ok().map(|v| (var, v)))
    {
        Some((var, v)) => parse(var, &v),
        None => Ok(EnvFilter::new(DEFAULT)),
    }
}

/// Whether a directive enables one of our modules (`agenshield_proxy::dns=debug`), which the
/// crate-level probe below does not see.
fn names_a_module_of_ours(value: &str) -> bool {
    value.split(',').any(|d| {
        let (target, level) = d.split_once('=').unwrap_or((d, "trace"));
        let target = target.split('[').next().unwrap_or("").trim();
        target.starts_with("agenshield") && !level.trim().eq_ignore_ascii_case("off")
    })
}

/// Whether an error logged by any of our crates passes `value`.
fn enables_our_errors(value: &str) -> bool {
    let Ok(filter) = EnvFilter::try_new(value) else {
        return false;
    };
    let subscriber = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::sink)
        .finish();
    tracing::subscriber::with_default(subscriber, || {
        // One callsite per target: `enabled!` takes its target as a literal.
        tracing::enabled!(target: "agenshield_proxy", tracing::Level::ERROR)
            || tracing::enabled!(target: "agenshield_pf", tracing::Level::ERROR)
            || tracing::enabled!(target: "agenshield_certs", tracing::Level::ERROR)
            || tracing::enabled!(target: "agenshield_cli", tracing::Level::ERROR)
            || tracing::enabled!(target: "agenshield", tracing::Level::ERROR)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The probe's callsites are shared: one test at a time sets a dispatcher for them.
    static ONE: std::sync::Mutex<()> = std::sync::Mutex::new(());

    #[test]
    fn levels_and_our_targets_are_accepted() {
        let _one = ONE.lock();
        for ok in [
            "info",
            "debug",
            "WARN",
            "error",
            "trace",
            "off",
            "agenshield_proxy=debug,h2=info",
            "debug,rustls=error",
            "agenshield=trace",
            "agenshield_proxy::dns=debug",
            "h2=debug,info",
        ] {
            assert!(parse("AGENSHIELD_LOG", ok).is_ok(), "{ok}");
        }
    }

    #[test]
    fn a_filter_that_silences_every_line_of_ours_is_refused_with_examples() {
        let _one = ONE.lock();
        for bad in ["verbose", "warning", "h2=debug", "hyper=trace,rustls=info"] {
            let err = parse("AGENSHIELD_LOG", bad).expect_err(bad).to_string();
            assert!(err.contains("enables no log line of agenshield"), "{err}");
            assert!(err.contains("agenshield_proxy=debug,h2=info"), "{err}");
        }
        let err = parse("AGENSHIELD_LOG", "verbose")
            .expect_err("verbose")
            .to_string();
        assert!(
            err.contains("\"verbose\" read as a module name, not a level"),
            "{err}"
        );
    }

    #[test]
    fn a_filter_that_does_not_parse_is_refused_with_examples() {
        let _one = ONE.lock();
        let err = parse("RUST_LOG", "info,foo=bogus")
            .expect_err("bogus level")
            .to_string();
        assert!(
            err.starts_with("RUST_LOG=\"info,foo=bogus\" is not a log filter"),
            "{err}"
        );
        assert!(err.contains("e.g. info, debug"), "{err}");
    }
}
