//! `ctl secrets set | list | rm`. A value comes from stdin or a no-echo prompt, never from
//! the command line (where `ps` and shell history would see it), and is never printed.

use std::io::{IsTerminal, Read};

use bytes::Bytes;
use http::Method;
use zeroize::Zeroizing;

use super::client::{read_json, Client, CtlError};
use super::{fail, output, print, FAILED};
use crate::cli::{ClientAuthArg, SecretsCommand};
use agenshield_proxy::secrets::fetch::provider::{ClientAuth, ProviderSpec};
use agenshield_proxy::secrets::store::value::MAX_VALUE_LEN;
use agenshield_proxy::secrets::{SecretName, SecretValue};

pub(super) async fn run(client: &Client, cmd: SecretsCommand, json: bool) -> u8 {
    match cmd {
        SecretsCommand::List => match client.json(Method::GET, "/v1/secrets", None).await {
            Ok(v) => print(&v, json, super::render::secrets),
            Err(e) => fail(e),
        },
        SecretsCommand::Set {
            name,
            from_command,
            oauth2_token_url,
            client_id,
            scope,
            client_auth,
            ttl,
            timeout,
        } => {
            let name = match SecretName::new(&name) {
                Ok(n) => n,
                Err(e) => {
                    return output::bad_input(e);
                }
            };
            let fetched = from_command.is_some() || oauth2_token_url.is_some();
            if !fetched && (ttl.is_some() || timeout.is_some()) {
                return output::bad_input(
                    "--ttl and --timeout are for fetched secrets (--from-command, \
                     --oauth2-token-url); a stored value is used until it is replaced",
                );
            }
            let ttl_secs = ttl.map_or(DEFAULT_TTL, |d| d.as_secs());
            let timeout_secs = timeout.map_or(DEFAULT_TIMEOUT, |d| d.as_secs());
            if let Some(command) = from_command {
                // `-`: the command from stdin, kept out of this process's arguments.
                let command = if command == "-" {
                    let text = match read_value(&name, "the command") {
                        Ok(b) => b,
                        Err(e) => return output::bad_input(e),
                    };
                    match std::str::from_utf8(&text) {
                        Ok(t) => t.trim_end_matches('\n').to_string(),
                        Err(_) => return output::bad_input("the command is not UTF-8"),
                    }
                } else {
                    command
                };
                let spec = ProviderSpec::Command {
                    command,
                    ttl_secs,
                    timeout_secs,
                };
                return set_fetched(client, &name, spec, json).await;
            }
            if let Some(token_url) = oauth2_token_url {
                let client_secret = match read_value(&name, "the OAuth2 client secret") {
                    Ok(b) => b,
                    Err(e) => {
                        return output::bad_input(e);
                    }
                };
                let Ok(client_secret) = String::from_utf8(client_secret.to_vec()) else {
                    return output::bad_input("the client secret is not UTF-8");
                };
                let spec = ProviderSpec::Oauth2 {
                    token_url,
                    client_id: client_id.unwrap_or_default(),
                    client_secret,
                    scope,
                    auth: match client_auth {
                        Some(ClientAuthArg::Post) => ClientAuth::Post,
                        Some(ClientAuthArg::Basic) | None => ClientAuth::Basic,
                    },
                    ttl_secs,
                    timeout_secs,
                };
                return set_fetched(client, &name, spec, json).await;
            }
            set(client, &name, json).await
        }
        SecretsCommand::Rm { name } => {
            if let Err(e) = SecretName::new(&name) {
                return output::bad_input(e);
            }
            let path = format!("/v1/secrets/{name}");
            match client.json(Method::DELETE, &path, None).await {
                Ok(v) => print(&v, json, |_| format!("secret {name} removed")),
                Err(CtlError::BadInput(e)) => output::bad_input(e),
                Err(e) => fail(e),
            }
        }
    }
}

/// A fetched value is used this long by default (seconds)…
const DEFAULT_TTL: u64 = 15 * 60;
/// …and a fetch may take this long.
const DEFAULT_TIMEOUT: u64 = 10;

/// Stores a fetched secret's definition; the daemon fetches it once first.
async fn set_fetched(client: &Client, name: &SecretName, spec: ProviderSpec, json: bool) -> u8 {
    // Checked here too, so a bad definition is exit 2 before anything is sent.
    if let Err(e) = spec.validate() {
        return output::bad_input(format!("secret {name}: {e}"));
    }
    let body = match serde_json::to_vec(&spec) {
        Ok(b) => Zeroizing::new(b),
        Err(e) => {
            return output::bad_input(format!("secret {name}: {e}"));
        }
    };
    drop(spec);
    let path = format!("/v1/secrets/{name}");
    let answer = match client
        .send_raw(
            Method::PUT,
            &path,
            Bytes::copy_from_slice(&body),
            "application/json",
        )
        .await
    {
        Ok((status, body)) => read_json(status, body).await,
        Err(e) => Err(e),
    };
    drop(body);
    match answer {
        Ok(v) => print(&v, json, |v| {
            format!(
                "secret {name} {} ({}; fetched, good until {}; {}); the agent uses the placeholder {}",
                if v["replaced"].as_bool() == Some(true) {
                    "replaced"
                } else {
                    "stored"
                },
                v["kind"].as_str().unwrap_or("?"),
                v["expires"].as_str().unwrap_or("?"),
                bound_by(v),
                v["placeholder"].as_str().unwrap_or("?")
            )
        }),
        Err(CtlError::BadInput(e)) => output::bad_input(e),
        Err(e) => fail(e),
    }
}

/// `bound by rule(s) a, b`, or that none binds it yet.
fn bound_by(v: &serde_json::Value) -> String {
    v["rules"]
        .as_array()
        .filter(|a| !a.is_empty())
        .map(|a| {
            let ids: Vec<&str> = a.iter().filter_map(|x| x.as_str()).collect();
            format!("bound by rule(s) {}", ids.join(", "))
        })
        .unwrap_or_else(|| "no rule binds it yet".into())
}

async fn set(client: &Client, name: &SecretName, json: bool) -> u8 {
    let bytes = match read_value(name, "the value") {
        Ok(b) => b,
        Err(e) => {
            return output::bad_input(e);
        }
    };
    // Checked here too, so a bad value is exit 2 before anything is sent.
    if let Err(e) = SecretValue::new(bytes.to_vec()) {
        return output::bad_input(format!("secret {name}: {e}"));
    }
    let path = format!("/v1/secrets/{name}");
    let body = Bytes::from(bytes.to_vec());
    drop(bytes);
    let answer = match client
        .send_raw(Method::PUT, &path, body, "application/octet-stream")
        .await
    {
        Ok((status, body)) => read_json(status, body).await,
        Err(e) => Err(e),
    };
    match answer {
        Ok(v) => print(&v, json, |v| {
            let rules = bound_by(v);
            format!(
                "secret {} {} ({rules}); the agent uses the placeholder {}",
                name,
                if v["replaced"].as_bool() == Some(true) {
                    "replaced"
                } else {
                    "stored"
                },
                v["placeholder"].as_str().unwrap_or("?")
            )
        }),
        Err(CtlError::BadInput(e)) => output::bad_input(e),
        Err(e) => {
            let code = fail(e);
            debug_assert_eq!(code, FAILED);
            code
        }
    }
}

/// From a prompt (twice, to catch typos) on a terminal, else all of stdin. `what`: what is
/// asked for (`the value`, `the OAuth2 client secret`).
fn read_value(name: &SecretName, what: &str) -> Result<Zeroizing<Vec<u8>>, String> {
    if std::io::stdin().is_terminal() {
        let first = Zeroizing::new(
            rpassword::prompt_password(format!("{what} for secret {name}: "))
                .map_err(|e| format!("reading the value: {e}"))?,
        );
        let again = Zeroizing::new(
            rpassword::prompt_password("again: ").map_err(|e| format!("reading the value: {e}"))?,
        );
        if *first != *again {
            return Err("the two values differ; nothing stored".into());
        }
        return Ok(Zeroizing::new(first.as_bytes().to_vec()));
    }
    let cap = MAX_VALUE_LEN + 3;
    let mut buf = Zeroizing::new(Vec::with_capacity(cap));
    let mut stdin = std::io::stdin().lock();
    (&mut stdin)
        .take(cap as u64)
        .read_to_end(&mut buf)
        .map_err(|e| format!("reading the value from stdin: {e}"))?;
    if buf.len() == cap {
        // Too long to keep: say how long it is, not how much was read.
        let len = agenshield_proxy::secrets::store::value::full_len(&buf, &mut stdin);
        return Err(agenshield_proxy::secrets::store::value::too_long(len));
    }
    if buf.last() == Some(&b'\n') {
        buf.pop();
        if buf.last() == Some(&b'\r') {
            buf.pop();
        }
    }
    if buf.is_empty() {
        return Err(format!(
            "no {} on stdin (pipe it in: `… | agenshield proxy ctl secrets set {name} …`)",
            what.trim_start_matches("the ")
        ));
    }
    Ok(buf)
}
