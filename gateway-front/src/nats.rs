//! A minimal NATS publisher (the completion log): CONNECT, then HPUB per record with its
//! Nats-Msg-Id header (JetStream captures core publishes on a stream's subject and drops a
//! repeated id), PING answered with PONG. Records wait in a bounded queue and go out in
//! batches (one write per many requests); when the queue is full or NATS is away the record
//! is dropped and counted, never slowing a request down. Reconnects with a backoff.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::sync::mpsc;

pub struct Record {
    pub subject: &'static str,
    pub msg_id: String,
    pub payload: Vec<u8>,
}

#[derive(Default)]
pub struct Counters {
    pub published: AtomicU64,
    pub dropped: AtomicU64,
    pub failed: AtomicU64,
    pub connected: AtomicU64,
}

#[derive(Clone)]
pub struct Publisher {
    tx: mpsc::Sender<Record>,
    pub counters: Arc<Counters>,
}

impl Publisher {
    /// Start the publishing task for `url` (nats://host:port); `capacity` records may wait.
    pub fn start(url: &str, capacity: usize) -> Publisher {
        let (tx, rx) = mpsc::channel(capacity);
        let counters = Arc::new(Counters::default());
        let (addr, hello) = connect_line(url);
        tokio::spawn(run(addr, hello, rx, counters.clone()));
        Publisher { tx, counters }
    }

    pub fn submit(&self, record: Record) {
        if self.tx.try_send(record).is_err() {
            self.counters.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }
}

fn frame(out: &mut Vec<u8>, r: &Record) {
    let head = format!("NATS/1.0\r\nNats-Msg-Id: {}\r\n\r\n", r.msg_id);
    out.extend_from_slice(
        format!(
            "HPUB {} {} {}\r\n",
            r.subject,
            head.len(),
            head.len() + r.payload.len()
        )
        .as_bytes(),
    );
    out.extend_from_slice(head.as_bytes());
    out.extend_from_slice(&r.payload);
    out.extend_from_slice(b"\r\n");
}

/// (host:port, the CONNECT line and a PING) for nats://[user[:pass]@ | token@]host:port.
pub fn connect_line(url: &str) -> (String, Vec<u8>) {
    let rest = url.trim_start_matches("nats://").trim_end_matches('/');
    let (creds, addr) = match rest.rsplit_once('@') {
        Some((c, a)) => (Some(c), a),
        None => (None, rest),
    };
    let mut opts = serde_json::json!({
        "verbose": false, "pedantic": false, "headers": true, "no_responders": false,
        "lang": "rust", "version": "0.1.0", "name": "agentrl-gateway-front", "protocol": 1,
    });
    match creds.map(|c| c.split_once(':')) {
        Some(Some((user, pass))) => {
            opts["user"] = user.into();
            opts["pass"] = pass.into();
        }
        Some(None) => opts["auth_token"] = creds.unwrap_or_default().into(),
        None => {}
    }
    let line = format!("CONNECT {opts}\r\nPING\r\n").into_bytes();
    (addr.to_string(), line)
}

async fn connect(addr: &str) -> std::io::Result<TcpStream> {
    let stream = TcpStream::connect(addr).await?;
    stream.set_nodelay(true)?;
    Ok(stream)
}

async fn run(
    addr: String,
    hello: Vec<u8>,
    mut rx: mpsc::Receiver<Record>,
    counters: Arc<Counters>,
) {
    let mut backoff = Duration::from_millis(100);
    let mut pending: Option<Record> = None; // taken from the queue when a connection broke
    loop {
        let stream = match connect(&addr).await {
            Ok(s) => s,
            Err(e) => {
                eprintln!("gateway-front: NATS {addr} unreachable: {e}");
                // records that cannot go out are dropped while NATS is away
                while let Ok(_r) = rx.try_recv() {
                    counters.dropped.fetch_add(1, Ordering::Relaxed);
                }
                pending = None;
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(5));
                continue;
            }
        };
        let (read, mut write) = stream.into_split();
        let mut lines = BufReader::new(read).lines();
        // INFO first, then our CONNECT (headers on: HPUB) and a PING whose PONG says it's up
        match lines.next_line().await {
            Ok(Some(l)) if l.starts_with("INFO") => {}
            other => {
                eprintln!("gateway-front: NATS {addr} sent no INFO: {other:?}");
                tokio::time::sleep(backoff).await;
                continue;
            }
        }
        if write.write_all(&hello).await.is_err() {
            continue;
        }
        counters.connected.store(1, Ordering::Relaxed);
        backoff = Duration::from_millis(100);
        let (pong_tx, mut pong_rx) = mpsc::channel::<()>(16);
        let reader = tokio::spawn(async move {
            while let Ok(Some(line)) = lines.next_line().await {
                if line.starts_with("PING") {
                    if pong_tx.send(()).await.is_err() {
                        break;
                    }
                } else if line.starts_with("-ERR") {
                    eprintln!("gateway-front: NATS said {line}");
                }
            }
        });
        let mut buf: Vec<u8> = Vec::with_capacity(64 * 1024);
        let broken = loop {
            buf.clear();
            let mut n = 0u64;
            if let Some(r) = pending.take() {
                frame(&mut buf, &r);
                n += 1;
            }
            if n == 0 {
                tokio::select! {
                    got = rx.recv() => match got {
                        Some(r) => { frame(&mut buf, &r); n += 1; }
                        None => break false, // the front is stopping
                    },
                    Some(()) = pong_rx.recv() => { buf.extend_from_slice(b"PONG\r\n"); }
                    _ = tokio::time::sleep(Duration::from_secs(30)) => { buf.extend_from_slice(b"PING\r\n"); }
                }
            }
            // everything else already queued goes in the same write
            while buf.len() < 1 << 20 {
                match rx.try_recv() {
                    Ok(r) => {
                        frame(&mut buf, &r);
                        n += 1;
                    }
                    Err(_) => break,
                }
            }
            if buf.is_empty() {
                continue;
            }
            if write.write_all(&buf).await.is_err() {
                counters.failed.fetch_add(n, Ordering::Relaxed);
                break true;
            }
            counters.published.fetch_add(n, Ordering::Relaxed);
            if reader.is_finished() {
                break true;
            }
        };
        counters.connected.store(0, Ordering::Relaxed);
        reader.abort();
        if !broken {
            let _ = write.flush().await;
            return;
        }
        eprintln!("gateway-front: NATS connection to {addr} lost; reconnecting");
    }
}

#[cfg(test)]
mod tests {
    use super::connect_line;

    #[test]
    fn credentials_go_in_connect() {
        let (addr, line) = connect_line("nats://alice:s3cret@127.0.0.1:4222");
        let text = String::from_utf8(line).unwrap();
        assert_eq!(addr, "127.0.0.1:4222");
        assert!(
            text.contains("\"user\":\"alice\"") && text.contains("\"pass\":\"s3cret\""),
            "{text}"
        );
        let (_, line) = connect_line("nats://tok@h:1");
        assert!(String::from_utf8(line)
            .unwrap()
            .contains("\"auth_token\":\"tok\""));
        let (addr, _) = connect_line("nats://h:1");
        assert_eq!(addr, "h:1");
    }
}
