//! The WebSocket guard between two real tungstenite peers over in-memory streams: what the
//! upstream receives, what the agent receives, and how a refusal closes both.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use tokio::io::DuplexStream;
use tokio_tungstenite::tungstenite::protocol::frame::coding::{CloseCode, Data, OpCode};
use tokio_tungstenite::tungstenite::protocol::frame::Frame;
use tokio_tungstenite::tungstenite::protocol::Role;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

use super::{FrameGuard, GuardedRelay};
use crate::policy::SwapPlaces;
use crate::record::End;
use crate::secrets::guard::scan::tests::binds;
use crate::secrets::Violation;

const GH: &str = "ghp_GITHUB_456789";
const OTHER: &str = "sk-OTHER-99887766";
const PLACEHOLDER: &str = "agenshield:secret:gh";

type Peer = WebSocketStream<DuplexStream>;

fn guard(websocket: bool, tls: bool) -> FrameGuard {
    let mut b = binds(&["gh"], vec![]);
    b.swap = SwapPlaces {
        websocket,
        ..SwapPlaces::default()
    };
    FrameGuard {
        set: Arc::new(crate::secrets::set::tests::set(&[
            ("gh", GH),
            ("other", OTHER),
        ])),
        bindings: Some(Arc::new(b)),
        dlp: None,
        swapped: Arc::default(),
        tls,
    }
}

/// The agent's end, the upstream's end, and the relay between them.
async fn start(
    g: FrameGuard,
) -> (
    Peer,
    Peer,
    tokio::task::JoinHandle<(GuardedRelay, FrameGuard)>,
) {
    let (agent_io, relay_agent) = tokio::io::duplex(1 << 16);
    let (relay_far, far_io) = tokio::io::duplex(1 << 16);
    let relay = tokio::spawn(async move {
        let stop = std::future::pending::<()>();
        let r = g
            .relay(relay_agent, relay_far, Duration::from_secs(10), stop)
            .await;
        (r, g)
    });
    let agent = WebSocketStream::from_raw_socket(agent_io, Role::Client, None).await;
    let far = WebSocketStream::from_raw_socket(far_io, Role::Server, None).await;
    (agent, far, relay)
}

/// Sends `parts` as one text message, one fragment each.
async fn fragmented(ws: &mut Peer, parts: &[&str]) {
    for (i, p) in parts.iter().enumerate() {
        let op = if i == 0 { Data::Text } else { Data::Continue };
        let last = i + 1 == parts.len();
        let f = Frame::message(Bytes::copy_from_slice(p.as_bytes()), OpCode::Data(op), last);
        ws.send(Message::Frame(f)).await.expect("send fragment");
    }
}

async fn next(ws: &mut Peer) -> Message {
    tokio::time::timeout(Duration::from_secs(5), ws.next())
        .await
        .expect("a message in time")
        .expect("not ended")
        .expect("a valid message")
}

#[tokio::test]
async fn a_placeholder_split_across_fragments_goes_up_as_the_value_and_comes_back_redacted() {
    let (mut agent, mut far, relay) = start(guard(true, true)).await;
    let msg = format!(r#"{{"op":"auth","token":"{PLACEHOLDER}"}}"#);
    // Split inside the placeholder at every position.
    let cut = msg.find(PLACEHOLDER).expect("there");
    for at in cut..cut + PLACEHOLDER.len() {
        fragmented(&mut agent, &[&msg[..at], &msg[at..]]).await;
        let got = next(&mut far).await;
        let want = msg.replace(PLACEHOLDER, GH);
        assert_eq!(got, Message::text(want.clone()), "split at {at}");
        // The upstream echoes it, itself in fragments, split inside the value.
        let v = want.find(GH).expect("value") + 3;
        fragmented(&mut far, &[&want[..v], &want[v..]]).await;
        assert_eq!(next(&mut agent).await, Message::text(msg.clone()));
    }
    // A ping is answered by the relay, and goes no further.
    far.send(Message::Ping(Bytes::from(GH)))
        .await
        .expect("ping");
    assert_eq!(next(&mut far).await, Message::Pong(Bytes::from(GH)));
    agent
        .send(Message::Ping(Bytes::from("hi")))
        .await
        .expect("ping");
    assert_eq!(next(&mut agent).await, Message::Pong(Bytes::from("hi")));
    // Binary messages from the upstream are redacted too.
    far.send(Message::binary(format!("bin {GH}").into_bytes()))
        .await
        .expect("send");
    let want = format!("bin {PLACEHOLDER}").into_bytes();
    assert_eq!(next(&mut agent).await, Message::binary(want));
    agent.close(None).await.expect("close");
    // The upstream sees the close and answers it; the relay ends at once.
    assert!(matches!(next(&mut far).await, Message::Close(_)));
    let _ = far.flush().await;
    let (r, g) = tokio::time::timeout(Duration::from_secs(2), relay)
        .await
        .expect("ended without waiting out the grace")
        .expect("join");
    assert_eq!(r.relayed.end, End::Closed);
    assert!(r.refused.is_none());
    assert!(r.relayed.up > 0 && r.relayed.down > 0);
    assert_eq!(g.swapped_names(), [Arc::<str>::from("gh")]);
}

/// The refusal of `send`; the agent is told (1008), unless it was closing itself.
async fn refused(g: FrameGuard, send: Message) -> (Violation, String) {
    let (mut agent, mut far, relay) = start(g).await;
    let closing = matches!(send, Message::Close(_));
    agent.send(send).await.expect("send");
    if !closing {
        let m = next(&mut agent).await;
        assert!(
            matches!(&m, Message::Close(Some(f)) if f.code == CloseCode::Policy),
            "{m:?}"
        );
    }
    // The upstream is told to go away, and sees nothing of the refused message.
    let to_far = next(&mut far).await;
    assert!(
        matches!(&to_far, Message::Close(Some(f)) if f.code == CloseCode::Away),
        "{to_far:?}"
    );
    let (r, _) = relay.await.expect("join");
    assert_eq!(r.relayed.end, End::Refused);
    let why = r.refused.expect("a refusal");
    (why.violation, why.place.to_string())
}

#[tokio::test]
async fn a_message_the_rule_may_not_carry_closes_both_sides_unsent() {
    // The rule does not swap in WebSocket messages.
    let (v, place) = refused(guard(false, true), Message::text(PLACEHOLDER)).await;
    assert_eq!(
        (v, place.as_str()),
        (Violation::NotSwapped, "WebSocket message")
    );
    // It does, but not over plain HTTP.
    let (v, place) = refused(guard(true, false), Message::text(PLACEHOLDER)).await;
    assert_eq!(v, Violation::NotSwapped);
    assert_eq!(place, "WebSocket message over plain HTTP");
    // A binary message is not rewritten.
    let bin = Message::binary(PLACEHOLDER.as_bytes().to_vec());
    let (v, place) = refused(guard(true, true), bin).await;
    assert_eq!(
        (v, place.as_str()),
        (Violation::NotSwapped, "WebSocket binary message")
    );
    // A secret the rule does not bind, as a value or a placeholder, or in a close reason.
    let (v, _) = refused(guard(true, true), Message::text(format!("x {OTHER}"))).await;
    assert_eq!(v, Violation::Leak);
    let (v, _) = refused(guard(true, true), Message::text("agenshield:secret:other")).await;
    assert_eq!(v, Violation::Scope);
    let close = Message::Close(Some(tokio_tungstenite::tungstenite::protocol::CloseFrame {
        code: CloseCode::Normal,
        reason: OTHER.into(),
    }));
    let (v, place) = refused(guard(true, true), close).await;
    assert_eq!(
        (v, place.as_str()),
        (Violation::Leak, "WebSocket close reason")
    );
}

#[tokio::test]
async fn a_message_over_the_limit_closes_the_connection() {
    let (mut agent, _far, relay) = start(guard(true, true)).await;
    let big = "x".repeat(super::MAX_MESSAGE + 1);
    // The relay stops reading partway; the send may or may not complete.
    let _ = agent.send(Message::text(big)).await;
    let (r, _) = tokio::time::timeout(Duration::from_secs(10), relay)
        .await
        .expect("ends")
        .expect("join");
    assert_eq!(r.relayed.end, End::Error);
}
