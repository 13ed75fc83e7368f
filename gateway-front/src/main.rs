//! agentrl's compiled gateway front: `POST /v1/chat/completions` routed by the sticky
//! weighted split of `agentrl.serving.split` (same hash, same slices), the model rewritten to
//! the version's served name, forwarded to the version's backend, the answer returned (a
//! stream passes through, event by event, with the completion's id and version as `model`).
//! Per-version counters (requests, errors, timeouts, latencies) at `GET /stats` for the
//! canary; each completion published on the completion log's NATS subject. The route table
//! is a JSON file the Python side replaces (atomic rename), re-read when it changes.
//!
//! Usage: gateway-front --listen 127.0.0.1:8080 --routes routes.json [--nats nats://h:p]
//!        [--threads N] [--poll-ms 100];  gateway-front split-check  (stdin JSON lines)

mod nats;
mod record;
mod routes;
mod split;

use bytes::Bytes;
use hyper::client::HttpConnector;
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::service::{make_service_fn, service_fn};
use hyper::{Body, Client, Method, Request, Response, Server, StatusCode};
use serde_json::{json, Map, Value};
use std::collections::{HashMap, VecDeque};
use std::convert::Infallible;
use std::io::BufRead;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

const VERSION_HEADER: &str = "x-agentrl-model-version";
const COMPLETION_HEADER: &str = "x-agentrl-completion-id";
const SESSION_HEADERS: [&str; 3] = ["x-agentrl-session", "x-episode-id", "x-session-id"];
const AGENT_HEADER: &str = "x-agentrl-agent";
const PROFILE_HEADER: &str = "x-agentrl-profile";
const MAX_BODY: u64 = 32 << 20;
const LATENCIES: usize = 4096;

#[cfg(test)]
mod tests {
    use super::find_event_end;

    #[test]
    fn events_end_at_a_blank_line_of_either_kind() {
        assert_eq!(find_event_end(b"data: 1\n\ndata: 2"), Some((7, 9)));
        assert_eq!(find_event_end(b"data: 1\r\n\r\nx"), Some((7, 11)));
        assert_eq!(find_event_end(b"data: 1\r\n\r"), None);
        assert_eq!(find_event_end(b"data: 1\n"), None);
    }
}

#[derive(Default)]
struct VersionStats {
    requests: u64,
    errors: u64,
    timeouts: u64,
    completion_tokens: u64,
    latency_ms: VecDeque<f64>,
}

impl VersionStats {
    fn snapshot(&self) -> Value {
        let mut lat: Vec<f64> = self.latency_ms.iter().copied().collect();
        lat.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
        let p = |q: f64| -> Value {
            if lat.is_empty() {
                Value::Null
            } else {
                json!(lat[((q * lat.len() as f64) as usize).min(lat.len() - 1)])
            }
        };
        json!({
            "requests": self.requests, "errors": self.errors, "timeouts": self.timeouts,
            "completion_tokens": self.completion_tokens,
            "latency_p50_ms": p(0.5), "latency_p99_ms": p(0.99),
        })
    }
}

#[derive(Default)]
struct Stats {
    split: HashMap<String, VersionStats>, // split-routed: the canary's evidence
    pinned: HashMap<String, VersionStats>, // requests naming a version by its id
    refused: u64,
}

/// One admitted chat request (released when its answer, or its stream, is done).
struct Admitted(Arc<State>);

impl Drop for Admitted {
    fn drop(&mut self) {
        self.0.inflight.fetch_sub(1, Ordering::Relaxed);
    }
}

struct State {
    inflight: AtomicU64,
    shed: AtomicU64,
    table: RwLock<Arc<routes::Table>>,
    stats: Mutex<Stats>,
    client: Client<HttpConnector, Body>,
    log: Option<nats::Publisher>,
    submitted: AtomicU64,
}

impl State {
    fn table(&self) -> Arc<routes::Table> {
        self.table.read().unwrap().clone()
    }

    fn count(&self, version: &str, pinned: bool, f: impl FnOnce(&mut VersionStats)) {
        let mut s = self.stats.lock().unwrap();
        let t = if pinned { &mut s.pinned } else { &mut s.split };
        match t.get_mut(version) {
            Some(v) => f(v),
            None => f(t.entry(version.to_string()).or_default()),
        }
    }
}

fn error(status: StatusCode, message: &str, type_: &str, code: Option<&str>) -> Response<Body> {
    let body =
        json!({"error": {"message": message, "type": type_, "param": Value::Null, "code": code}});
    let mut r = Response::new(Body::from(serde_json::to_vec(&body).unwrap_or_default()));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}

fn json_response(value: &Value) -> Response<Body> {
    let mut r = Response::new(Body::from(serde_json::to_vec(value).unwrap_or_default()));
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}

/// A header as the gateway reads it: bytes decoded as latin-1 (so the key hashes the same).
fn header_text(req: &Request<Body>, name: &str) -> Option<String> {
    req.headers()
        .get(name)
        .map(|v| v.as_bytes().iter().map(|&b| b as char).collect())
}

/// The session key, as `gateway._session_key`: the first non-empty session header, else
/// the body's `episode_id`, `user`, `metadata.session_id`.
fn session_key(req: &Request<Body>, body: &Map<String, Value>) -> Option<String> {
    for h in SESSION_HEADERS {
        if let Some(v) = header_text(req, h) {
            if !v.is_empty() {
                return Some(v);
            }
        }
    }
    for f in ["episode_id", "user"] {
        if let Some(Value::String(s)) = body.get(f) {
            if !s.is_empty() {
                return Some(s.clone());
            }
        }
    }
    match body.get("metadata").and_then(|m| m.get("session_id")) {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) if s.is_empty() => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(Value::Bool(false)) => None,
        Some(Value::Bool(true)) => Some("True".to_string()),
        Some(Value::Number(n)) if n.as_f64() == Some(0.0) => None,
        Some(other) => Some(other.to_string()),
    }
}

fn completion_id() -> String {
    let a: u128 = rand::random();
    format!("chatcmpl-{a:032x}")
}

fn authorized(req: &Request<Body>, keys: &[String]) -> bool {
    if keys.is_empty() {
        return true;
    }
    let auth = header_text(req, "authorization").unwrap_or_default();
    let (scheme, token) = auth.split_once(' ').unwrap_or((&auth, ""));
    let token = token.trim();
    scheme.eq_ignore_ascii_case("bearer")
        && keys.iter().fold(false, |ok, k| {
            ok | constant_eq(k.as_bytes(), token.as_bytes())
        })
}

fn constant_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

async fn handle(state: Arc<State>, req: Request<Body>) -> Result<Response<Body>, Infallible> {
    let path = req.uri().path();
    Ok(match (req.method(), path) {
        (&Method::POST, "/v1/chat/completions") => {
            let max = state.table().max_inflight as u64;
            if state.inflight.fetch_add(1, Ordering::Relaxed) >= max {
                state.inflight.fetch_sub(1, Ordering::Relaxed);
                state.shed.fetch_add(1, Ordering::Relaxed);
                let mut r = error(
                    StatusCode::TOO_MANY_REQUESTS,
                    "the gateway is at its limit of requests in flight; retry shortly",
                    "rate_limit_exceeded",
                    Some("busy"),
                );
                r.headers_mut()
                    .insert("retry-after", HeaderValue::from_static("1"));
                r
            } else {
                let admitted = Admitted(state.clone());
                chat(state, req, admitted).await
            }
        }
        (&Method::GET, "/health") => json_response(&json!({"status": "ok"})),
        (&Method::GET, "/stats") => {
            if authorized(&req, &state.table().api_keys) {
                stats(&state)
            } else {
                unauthorized()
            }
        }
        (&Method::GET, "/v1/models") => {
            let t = state.table();
            if !authorized(&req, &t.api_keys) {
                unauthorized()
            } else {
                let data: Vec<Value> = t
                    .models()
                    .iter()
                    .map(|m| json!({"id": m, "object": "model", "created": 0, "owned_by": "agentrl"}))
                    .collect();
                json_response(&json!({"object": "list", "data": data}))
            }
        }
        _ => error(
            StatusCode::NOT_FOUND,
            "no such route",
            "invalid_request_error",
            None,
        ),
    })
}

fn unauthorized() -> Response<Body> {
    error(
        StatusCode::UNAUTHORIZED,
        "Incorrect or missing API key: send 'Authorization: Bearer <key>'.",
        "invalid_request_error",
        Some("invalid_api_key"),
    )
}

fn stats(state: &State) -> Response<Body> {
    let s = state.stats.lock().unwrap();
    let snap = |t: &HashMap<String, VersionStats>| -> Value {
        Value::Object(t.iter().map(|(k, v)| (k.clone(), v.snapshot())).collect())
    };
    let mut out = json!({
        "stats": snap(&s.split), "pinned": snap(&s.pinned), "refused": s.refused,
        "inflight": state.inflight.load(Ordering::Relaxed), "shed": state.shed.load(Ordering::Relaxed),
        "generation": state.table().generation,
    });
    if let Some(log) = &state.log {
        let c = &log.counters;
        out["completion_log"] = json!({
            "published": c.published.load(Ordering::Relaxed),
            "dropped": c.dropped.load(Ordering::Relaxed),
            "failed": c.failed.load(Ordering::Relaxed),
            "connected": c.connected.load(Ordering::Relaxed) == 1,
        });
    }
    json_response(&out)
}

async fn chat(state: Arc<State>, req: Request<Body>, admitted: Admitted) -> Response<Body> {
    let table = state.table();
    if !authorized(&req, &table.api_keys) {
        return unauthorized();
    }
    let too_long = req
        .headers()
        .get(hyper::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
        .map(|n| n > MAX_BODY)
        .unwrap_or(false);
    if too_long {
        return error(
            StatusCode::PAYLOAD_TOO_LARGE,
            "request body too large",
            "invalid_request_error",
            None,
        );
    }
    let session_heads: Vec<Option<String>> = [AGENT_HEADER, PROFILE_HEADER]
        .iter()
        .map(|h| header_text(&req, h))
        .collect();
    let (parts, body) = req.into_parts();
    let req_head = Request::from_parts(parts, Body::empty());
    let raw = match hyper::body::to_bytes(body).await {
        Ok(b) if b.len() as u64 <= MAX_BODY => b,
        Ok(_) => {
            return error(
                StatusCode::PAYLOAD_TOO_LARGE,
                "request body too large",
                "invalid_request_error",
                None,
            )
        }
        Err(e) => {
            return error(
                StatusCode::BAD_REQUEST,
                &format!("could not read the body: {e}"),
                "invalid_request_error",
                None,
            )
        }
    };
    let mut body: Map<String, Value> = match serde_json::from_slice(&raw) {
        Ok(Value::Object(m)) => m,
        Ok(_) => {
            return error(
                StatusCode::BAD_REQUEST,
                "invalid request: the body is not a JSON object",
                "invalid_request_error",
                None,
            )
        }
        Err(e) => {
            return error(
                StatusCode::BAD_REQUEST,
                &format!("invalid request: {e}"),
                "invalid_request_error",
                None,
            )
        }
    };
    let asked = match body.get("model") {
        Some(Value::String(s)) => s.clone(),
        _ => {
            return error(
                StatusCode::BAD_REQUEST,
                "invalid request: model: Field required (a string)",
                "invalid_request_error",
                None,
            )
        }
    };
    if !matches!(body.get("messages"), Some(Value::Array(_))) {
        return error(
            StatusCode::BAD_REQUEST,
            "invalid request: messages: Field required (a list)",
            "invalid_request_error",
            None,
        );
    }
    for f in ["user", "episode_id"] {
        if !matches!(
            body.get(f),
            None | Some(Value::Null) | Some(Value::String(_))
        ) {
            return error(
                StatusCode::BAD_REQUEST,
                &format!("invalid request: {f}: Input should be a valid string"),
                "invalid_request_error",
                None,
            );
        }
    }
    let session = session_key(&req_head, &body);
    let name = if table.by_agent.is_empty() && table.by_profile.is_empty() {
        asked.as_str()
    } else {
        table.lineage_for(
            &asked,
            session_heads[0].as_deref(),
            session_heads[1].as_deref(),
        )
    };
    let (version, pinned) = match table.resolve(name, session.as_deref()) {
        routes::Resolved::Version(v, pinned) => (v.to_string(), pinned),
        routes::Resolved::NotServing(msg) => {
            return error(
                StatusCode::SERVICE_UNAVAILABLE,
                &msg,
                "service_unavailable",
                None,
            )
        }
        routes::Resolved::Unknown => {
            let msg = format!(
                "The model '{asked}' does not exist. Available models: {}",
                table.models().join(", ")
            );
            let mut r = error(
                StatusCode::NOT_FOUND,
                &msg,
                "invalid_request_error",
                Some("model_not_found"),
            );
            if let Ok(b) = serde_json::to_vec(
                &json!({"error": {"message": msg, "type": "invalid_request_error", "param": "model", "code": "model_not_found"}}),
            ) {
                *r.body_mut() = Body::from(b);
            }
            return r;
        }
    };
    let target = &table.versions[&version];
    // the upstream's body: as `UpstreamBackend._body` (None fields and episode_id left out)
    body.retain(|k, v| !v.is_null() && k != "episode_id");
    body.insert(
        "model".to_string(),
        Value::String(target.served_name.clone()),
    );
    let stream = matches!(body.get("stream"), Some(Value::Bool(true)));
    if matches!(body.get("logprobs"), Some(Value::Bool(true))) {
        body.entry("return_tokens_as_token_ids")
            .or_insert(Value::Bool(true));
    }
    let cid = completion_id();
    state.count(&version, pinned, |s| s.requests += 1);
    let started = Instant::now();
    let url = format!("{}/chat/completions", target.backend.trim_end_matches('/'));
    let mut upstream = Request::builder()
        .method(Method::POST)
        .uri(&url)
        .header(CONTENT_TYPE, "application/json");
    if let Some(auth) = &target.authorization {
        upstream = upstream.header(hyper::header::AUTHORIZATION, auth.as_str());
    }
    let upstream = upstream.body(Body::from(serde_json::to_vec(&body).unwrap_or_default()));
    let upstream = match upstream {
        Ok(r) => r,
        Err(e) => {
            return failed(
                &state,
                &version,
                pinned,
                &cid,
                502,
                &format!("bad backend URL {url}: {e}"),
            )
        }
    };
    let deadline = Duration::from_secs_f64(table.timeout_s.max(0.001));
    let call = async {
        let resp = state.client.request(upstream).await?;
        if stream && resp.status() == StatusCode::OK {
            return Ok((resp, None));
        }
        let (parts, body) = resp.into_parts();
        let bytes = hyper::body::to_bytes(body).await?;
        Ok::<_, hyper::Error>((Response::from_parts(parts, Body::empty()), Some(bytes)))
    };
    let (resp, bytes) = match tokio::time::timeout(deadline, call).await {
        Err(_) => {
            let msg = format!("model version {version} did not answer in time");
            return failed(&state, &version, pinned, &cid, 504, &msg);
        }
        Ok(Err(e)) => {
            let msg = format!(
                "model version {version} failed: upstream {} failed: {e}",
                target.backend
            );
            return failed(&state, &version, pinned, &cid, 502, &msg);
        }
        Ok(Ok(x)) => x,
    };
    let status = resp.status();
    if status != StatusCode::OK {
        let text = bytes
            .map(|b| String::from_utf8_lossy(&b[..b.len().min(500)]).into_owned())
            .unwrap_or_default();
        let code = if status.as_u16() >= 500 {
            502
        } else {
            status.as_u16()
        };
        let msg = format!("model version {version} failed: upstream answered {status}: {text}");
        return failed(&state, &version, pinned, &cid, code, &msg);
    }
    match bytes {
        None => stream_answer(
            state.clone(),
            resp,
            version,
            pinned,
            cid,
            session,
            started,
            admitted,
            deadline,
        ),
        Some(bytes) => {
            let mut data: Value = match serde_json::from_slice(&bytes) {
                Ok(v @ Value::Object(_))
                    if v.get("choices")
                        .and_then(Value::as_array)
                        .map(|a| !a.is_empty())
                        .unwrap_or(false) =>
                {
                    v
                }
                _ => {
                    let msg = format!(
                        "model version {version} failed: upstream answer is not a chat completion"
                    );
                    return failed(&state, &version, pinned, &cid, 502, &msg);
                }
            };
            let gen = record::from_answer(&data);
            let ms = started.elapsed().as_secs_f64() * 1000.0;
            state.count(&version, pinned, |s| {
                s.completion_tokens += gen.completion_tokens;
                if s.latency_ms.len() == LATENCIES {
                    s.latency_ms.pop_front();
                }
                s.latency_ms.push_back(ms);
            });
            log_completion(&state, &cid, &version, session.as_deref(), &gen);
            data["id"] = Value::String(cid.clone());
            data["model"] = Value::String(version.clone());
            let mut r = json_response(&data);
            tag(&mut r, &version, &cid);
            r
        }
    }
}

fn tag(r: &mut Response<Body>, version: &str, cid: &str) {
    if let Ok(v) = HeaderValue::from_str(version) {
        r.headers_mut().insert(VERSION_HEADER, v);
    }
    if let Ok(v) = HeaderValue::from_str(cid) {
        r.headers_mut().insert(COMPLETION_HEADER, v);
    }
}

fn log_completion(
    state: &State,
    cid: &str,
    version: &str,
    session: Option<&str>,
    gen: &record::Gen,
) {
    let Some(log) = &state.log else { return };
    match record::wire(cid, version, session, gen) {
        Some(payload) => {
            state.submitted.fetch_add(1, Ordering::Relaxed);
            log.submit(nats::Record {
                subject: record::SUBJECT,
                msg_id: cid.to_string(),
                payload,
            });
        }
        None => eprintln!("gateway-front: completion {cid} not logged: invalid record"),
    }
}

/// A failed request: >= 500 is the version's error (counted), < 500 the input's (uncounted).
fn failed(
    state: &State,
    version: &str,
    pinned: bool,
    cid: &str,
    status: u16,
    msg: &str,
) -> Response<Body> {
    if status >= 500 {
        state.count(version, pinned, |s| {
            s.errors += 1;
            if status == 504 {
                s.timeouts += 1;
            }
        });
        eprintln!(
            "gateway-front: backend of {version} answered {status}: {}",
            &msg[..msg.len().min(300)]
        );
    } else {
        state.count(version, pinned, |s| {
            s.requests = s.requests.saturating_sub(1)
        });
        state.stats.lock().unwrap().refused += 1;
    }
    let type_ = if status >= 500 {
        "server_error"
    } else {
        "invalid_request_error"
    };
    let code = if status == 504 {
        Some("upstream_timeout")
    } else {
        None
    };
    let mut r = error(
        StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY),
        msg,
        type_,
        code,
    );
    tag(&mut r, version, cid);
    r
}

/// The upstream's server-sent events passed on as they come, each JSON event with the
/// completion's id and the version as `model`; folded into the completion record, logged
/// with the counters when the stream ends.
struct Relay {
    upstream: Body,
    buf: Vec<u8>,
    gen: record::Gen,
    state: Arc<State>,
    version: String,
    pinned: bool,
    cid: String,
    session: Option<String>,
    started: Instant,
    done: bool,
    timeout: Duration, // the longest wait for the next read (a stalled backend)
    failed: Option<String>, // a chunk that was not a JSON object: the stream ends there
    _admitted: Admitted, // in flight until the stream ends
}

impl Relay {
    fn event(&mut self, event: &[u8], out: &mut Vec<u8>) {
        let text = event
            .strip_prefix(b"data: ")
            .or_else(|| event.strip_prefix(b"data:"));
        match text {
            Some(payload) if payload.trim_ascii() != b"[DONE]" => {
                match serde_json::from_slice::<Value>(payload) {
                    Ok(mut chunk @ Value::Object(_)) => {
                        record::accumulate(&mut self.gen, &chunk);
                        chunk["id"] = Value::String(self.cid.clone());
                        chunk["model"] = Value::String(self.version.clone());
                        out.extend_from_slice(b"data: ");
                        out.extend_from_slice(&serde_json::to_vec(&chunk).unwrap_or_default());
                        out.extend_from_slice(b"\n\n");
                    }
                    _ => {
                        let shown = String::from_utf8_lossy(&payload[..payload.len().min(200)]);
                        self.failed = Some(format!(
                            "upstream sent a chunk that is not a JSON object: {shown}"
                        ));
                    }
                }
            }
            _ => {
                out.extend_from_slice(event);
                out.extend_from_slice(b"\n\n");
            }
        }
    }

    /// The in-band end of a stream that failed mid-way, as the gateway's: an error event
    /// (counted as the version's error; a timeout also as a timeout), then [DONE].
    fn fail(&mut self, status: u16, msg: &str) -> Bytes {
        self.finish(false);
        if status == 504 {
            self.state
                .count(&self.version, self.pinned, |s| s.timeouts += 1);
        }
        eprintln!(
            "gateway-front: stream of {} failed ({status}): {msg}",
            self.version
        );
        let err = json!({"error": {
            "message": format!("model version {} failed mid-stream: {msg}", self.version),
            "type": "server_error", "param": Value::Null, "code": status.to_string(),
        }});
        let mut out = b"data: ".to_vec();
        out.extend_from_slice(&serde_json::to_vec(&err).unwrap_or_default());
        out.extend_from_slice(b"\n\ndata: [DONE]\n\n");
        Bytes::from(out)
    }

    fn finish(&mut self, ok: bool) {
        let ms = self.started.elapsed().as_secs_f64() * 1000.0;
        let tokens = self.gen.completion_tokens;
        self.state.count(&self.version, self.pinned, |s| {
            if ok {
                s.completion_tokens += tokens;
                if s.latency_ms.len() == LATENCIES {
                    s.latency_ms.pop_front();
                }
                s.latency_ms.push_back(ms);
            } else {
                s.errors += 1;
            }
        });
        if ok {
            log_completion(
                &self.state,
                &self.cid,
                &self.version,
                self.session.as_deref(),
                &self.gen,
            );
        }
    }
}

/// The end of the first complete event in `buf`: (its length without the blank line, the
/// bytes to consume). Events end with a blank line: "\n\n" or "\r\n\r\n".
fn find_event_end(buf: &[u8]) -> Option<(usize, usize)> {
    let mut i = 0;
    while i + 1 < buf.len() {
        if buf[i] == b'\n' {
            let end = if i > 0 && buf[i - 1] == b'\r' {
                i - 1
            } else {
                i
            };
            if buf[i + 1] == b'\n' {
                return Some((end, i + 2));
            }
            if buf[i + 1] == b'\r' && i + 2 < buf.len() && buf[i + 2] == b'\n' {
                return Some((end, i + 3));
            }
        }
        i += 1;
    }
    None
}

#[allow(clippy::too_many_arguments)]
fn stream_answer(
    state: Arc<State>,
    resp: Response<Body>,
    version: String,
    pinned: bool,
    cid: String,
    session: Option<String>,
    started: Instant,
    admitted: Admitted,
    timeout: Duration,
) -> Response<Body> {
    use futures_util::StreamExt;
    let (parts, upstream) = resp.into_parts();
    let relay = Relay {
        upstream,
        buf: Vec::new(),
        gen: record::Gen::default(),
        state,
        version: version.clone(),
        pinned,
        cid: cid.clone(),
        session,
        started,
        done: false,
        timeout,
        failed: None,
        _admitted: admitted,
    };
    let events = futures_util::stream::unfold(relay, |mut r| async move {
        if r.done {
            return None;
        }
        loop {
            let next = match tokio::time::timeout(r.timeout, r.upstream.next()).await {
                Ok(next) => next,
                Err(_) => {
                    r.done = true;
                    let msg = format!("no data from the backend for {:?}", r.timeout);
                    let end = r.fail(504, &msg);
                    return Some((Ok::<Bytes, std::io::Error>(end), r));
                }
            };
            match next {
                Some(Ok(data)) => {
                    r.buf.extend_from_slice(&data);
                    let mut out = Vec::with_capacity(data.len() + 128);
                    while let Some((end, used)) = find_event_end(&r.buf) {
                        let event: Vec<u8> = r.buf.drain(..used).collect();
                        r.event(&event[..end], &mut out);
                        if let Some(msg) = r.failed.take() {
                            r.done = true;
                            let end = r.fail(502, &msg);
                            out.extend_from_slice(&end);
                            return Some((Ok(Bytes::from(out)), r));
                        }
                    }
                    if !out.is_empty() {
                        return Some((Ok(Bytes::from(out)), r));
                    }
                }
                Some(Err(e)) => {
                    r.done = true;
                    let end = r.fail(502, &format!("the backend's stream broke: {e}"));
                    return Some((Ok(end), r));
                }
                None => {
                    r.done = true;
                    let rest = std::mem::take(&mut r.buf);
                    r.finish(true);
                    if rest.is_empty() {
                        return None;
                    }
                    return Some((Ok(Bytes::from(rest)), r));
                }
            }
        }
    });
    let mut out = Response::new(Body::wrap_stream(events));
    let ct = parts
        .headers
        .get(CONTENT_TYPE)
        .cloned()
        .unwrap_or(HeaderValue::from_static("text/event-stream"));
    out.headers_mut().insert(CONTENT_TYPE, ct);
    out.headers_mut()
        .insert("cache-control", HeaderValue::from_static("no-cache"));
    tag(&mut out, &version, &cid);
    out
}

/// Re-read the route table when its content changed. Read every poll (a few KB from the page
/// cache, microseconds): two writes within the file system's timestamp tick keep the same
/// mtime, and a swap of two weights the same size. A bad file keeps the table in force.
async fn watch(state: Arc<State>, path: PathBuf, every: Duration) {
    let mut seen: Option<Vec<u8>> = None;
    loop {
        if let Ok(bytes) = std::fs::read(&path) {
            if seen.as_deref() != Some(bytes.as_slice()) {
                match routes::Table::parse(&bytes) {
                    Ok(t) => *state.table.write().unwrap() = Arc::new(t),
                    Err(e) => eprintln!(
                        "gateway-front: route table {} not loaded (the last one stays): {e}",
                        path.display()
                    ),
                }
                seen = Some(bytes);
            }
        }
        tokio::time::sleep(every).await;
    }
}

/// `split-check`: stdin JSON lines {weights, order, key, salt} -> {"version", "point"}
/// (the parity test against `agentrl.serving.split.choose`).
fn split_check() {
    let stdin = std::io::stdin();
    for line in stdin.lock().lines() {
        let line = line.expect("stdin");
        let q: Value = serde_json::from_str(&line).expect("a JSON line");
        let weights: HashMap<String, f64> =
            serde_json::from_value(q["weights"].clone()).unwrap_or_default();
        let order: Vec<String> = serde_json::from_value(q["order"].clone()).unwrap_or_default();
        let key = q["key"].as_str();
        let salt = q["salt"].as_str().unwrap_or("");
        let w = |v: &str| weights.get(v).copied().unwrap_or(0.0);
        let version = split::choose(&w, &order, key, salt);
        let point = key.map(|k| split::session_point(k, salt));
        println!("{}", json!({"version": version, "point": point}));
    }
}

struct Args {
    listen: SocketAddr,
    routes: PathBuf,
    nats: Option<String>,
    threads: usize,
    poll: Duration,
}

fn args() -> Result<Args, String> {
    let mut it = std::env::args().skip(1);
    let (mut listen, mut routes, mut nats, mut threads, mut poll) =
        ("127.0.0.1:8080".to_string(), None, None, 1usize, 100u64);
    while let Some(a) = it.next() {
        let mut val = || it.next().ok_or(format!("{a} needs a value"));
        match a.as_str() {
            "--listen" => listen = val()?,
            "--routes" => routes = Some(PathBuf::from(val()?)),
            "--nats" => nats = Some(val()?),
            "--threads" => threads = val()?.parse().map_err(|e| format!("--threads: {e}"))?,
            "--poll-ms" => poll = val()?.parse().map_err(|e| format!("--poll-ms: {e}"))?,
            other => return Err(format!("unknown argument {other}")),
        }
    }
    Ok(Args {
        listen: listen
            .parse()
            .map_err(|e| format!("--listen {listen}: {e}"))?,
        routes: routes.ok_or("--routes is required")?,
        nats,
        threads: threads.max(1),
        poll: Duration::from_millis(poll.max(10)),
    })
}

fn main() {
    if std::env::args().nth(1).as_deref() == Some("split-check") {
        return split_check();
    }
    let args = match args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("gateway-front: {e}");
            std::process::exit(2);
        }
    };
    let rt = if args.threads == 1 {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(args.threads)
            .enable_all()
            .build()
    }
    .expect("tokio runtime");
    rt.block_on(serve(args));
}

async fn serve(args: Args) {
    let table = match std::fs::read(&args.routes)
        .map_err(|e| e.to_string())
        .and_then(|b| routes::Table::parse(&b))
    {
        Ok(t) => t,
        Err(e) => {
            eprintln!("gateway-front: route table {}: {e}", args.routes.display());
            std::process::exit(2);
        }
    };
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    let client = Client::builder()
        .pool_max_idle_per_host(512)
        .build(connector);
    let state = Arc::new(State {
        inflight: AtomicU64::new(0),
        shed: AtomicU64::new(0),
        table: RwLock::new(Arc::new(table)),
        stats: Mutex::new(Stats::default()),
        client,
        log: args
            .nats
            .as_deref()
            .map(|u| nats::Publisher::start(u, 20_000)),
        submitted: AtomicU64::new(0),
    });
    tokio::spawn(watch(state.clone(), args.routes.clone(), args.poll));
    let svc_state = state.clone();
    let make = make_service_fn(move |_conn| {
        let st = svc_state.clone();
        async move { Ok::<_, Infallible>(service_fn(move |req| handle(st.clone(), req))) }
    });
    let server = match Server::try_bind(&args.listen) {
        Ok(b) => b.http1_only(true).tcp_nodelay(true).serve(make),
        Err(e) => {
            eprintln!("gateway-front: cannot listen on {}: {e}", args.listen);
            std::process::exit(2);
        }
    };
    println!("gateway-front listening on http://{}", server.local_addr());
    let stop = async {
        use tokio::signal::unix::{signal, SignalKind};
        let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
        tokio::select! { _ = term.recv() => {}, _ = tokio::signal::ctrl_c() => {} }
    };
    if let Err(e) = server.with_graceful_shutdown(stop).await {
        eprintln!("gateway-front: server error: {e}");
    }
    // the completion log's queue drains (up to 2 s) before the process ends
    if let Some(log) = &state.log {
        let c = &log.counters;
        let until = Instant::now() + Duration::from_secs(2);
        while Instant::now() < until
            && c.published.load(Ordering::Relaxed)
                + c.dropped.load(Ordering::Relaxed)
                + c.failed.load(Ordering::Relaxed)
                < state.submitted.load(Ordering::Relaxed)
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}
