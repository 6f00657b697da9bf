//! `ctl secrets set | list | rm`. A value comes from stdin or a no-echo prompt, never from
//! the command line (where `ps` and shell history would see it), and is never printed.

use std::io::{IsTerminal, Read};

use bytes::Bytes;
use http::Method;
use zeroize::Zeroizing;

use super::client::{read_json, Client, CtlError};
use super::{fail, print, BAD_INPUT, FAILED};
use crate::cli::SecretsCommand;
use crate::secrets::value::MAX_VALUE_LEN;
use crate::secrets::{SecretName, SecretValue};

pub(super) async fn run(client: &Client, cmd: SecretsCommand, json: bool) -> u8 {
    match cmd {
        SecretsCommand::List => match client.json(Method::GET, "/v1/secrets", None).await {
            Ok(v) => print(&v, json, super::render::secrets),
            Err(e) => fail(e),
        },
        SecretsCommand::Set { name } => set(client, &name, json).await,
        SecretsCommand::Rm { name } => {
            if let Err(e) = SecretName::new(&name) {
                eprintln!("agenshield: {e}");
                return BAD_INPUT;
            }
            let path = format!("/v1/secrets/{name}");
            match client.json(Method::DELETE, &path, None).await {
                Ok(v) => print(&v, json, |_| format!("secret {name} removed")),
                Err(CtlError::BadInput(e)) => {
                    eprintln!("agenshield: {e}");
                    BAD_INPUT
                }
                Err(e) => fail(e),
            }
        }
    }
}

async fn set(client: &Client, name: &str, json: bool) -> u8 {
    let name = match SecretName::new(name) {
        Ok(n) => n,
        Err(e) => {
            eprintln!("agenshield: {e}");
            return BAD_INPUT;
        }
    };
    let bytes = match read_value(&name) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("agenshield: {e}");
            return BAD_INPUT;
        }
    };
    // Checked here too, so a bad value is exit 2 before anything is sent.
    if let Err(e) = SecretValue::new(bytes.to_vec()) {
        eprintln!("agenshield: secret {name}: {e}");
        return BAD_INPUT;
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
            let rules = v["rules"]
                .as_array()
                .filter(|a| !a.is_empty())
                .map(|a| {
                    let ids: Vec<&str> = a.iter().filter_map(|x| x.as_str()).collect();
                    format!("bound by rule(s) {}", ids.join(", "))
                })
                .unwrap_or_else(|| "no rule binds it yet".into());
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
        Err(CtlError::BadInput(e)) => {
            eprintln!("agenshield: {e}");
            BAD_INPUT
        }
        Err(e) => {
            let code = fail(e);
            debug_assert_eq!(code, FAILED);
            code
        }
    }
}

/// From a prompt (twice, to catch typos) on a terminal, else all of stdin.
fn read_value(name: &SecretName) -> Result<Zeroizing<Vec<u8>>, String> {
    if std::io::stdin().is_terminal() {
        let first = Zeroizing::new(
            rpassword::prompt_password(format!("value for secret {name}: "))
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
    std::io::stdin()
        .lock()
        .take(cap as u64)
        .read_to_end(&mut buf)
        .map_err(|e| format!("reading the value from stdin: {e}"))?;
    if buf.last() == Some(&b'\n') {
        buf.pop();
        if buf.last() == Some(&b'\r') {
            buf.pop();
        }
    }
    if buf.is_empty() {
        return Err(format!(
            "no value on stdin (pipe it in: `… | agenshield proxy ctl secrets set {name}`)"
        ));
    }
    Ok(buf)
}
