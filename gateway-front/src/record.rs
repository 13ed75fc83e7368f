//! The completion log's record, as `agentrl.serving.gateway.completion_wire` writes it
//! (the fields of `CompletionRecord`, in its order): token ids and log-probs read from an
//! OpenAI-compatible answer the way `backends.from_openai` / `_accumulate` read them
//! (vLLM's `prompt_token_ids` / `token_ids`, else "token_id:N" tokens of the log-probs).

use serde::Serialize;
use serde_json::Value;
use std::time::{SystemTime, UNIX_EPOCH};

pub const SUBJECT: &str = "agent.rl.completion.v1";

#[derive(Default, Debug)]
pub struct Gen {
    pub prompt_token_ids: Vec<i64>,
    pub completion_token_ids: Vec<i64>,
    pub logprobs: Vec<f64>,
    pub finish_reason: Option<String>,
    pub completion_tokens: u64,
    /// a value the record would refuse (a non-integer id, a NaN log-prob): not logged
    pub invalid: bool,
}

#[derive(Serialize)]
struct Wire<'a> {
    completion_id: &'a str,
    model: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    session_id: Option<&'a str>,
    prompt_token_ids: &'a [i64],
    completion_token_ids: &'a [i64],
    completion_logprobs: &'a [f64],
    constrained: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    finish_reason: Option<&'a str>,
    timestamp: String,
}

fn ids(v: &Value, gen_invalid: &mut bool) -> Vec<i64> {
    match v.as_array() {
        Some(a) => a
            .iter()
            .filter_map(|x| {
                let id = x.as_i64();
                if id.is_none() {
                    *gen_invalid = true;
                }
                id
            })
            .collect(),
        None => Vec::new(),
    }
}

fn token_id(token: &str) -> Option<i64> {
    token.strip_prefix("token_id:")?.parse().ok()
}

fn logprob_entries(choice: &Value) -> &[Value] {
    choice
        .get("logprobs")
        .and_then(|l| l.get("content"))
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or(&[])
}

fn push_logprob(gen: &mut Gen, e: &Value) {
    match e.get("logprob") {
        None | Some(Value::Null) => gen.logprobs.push(0.0),
        Some(v) => match v.as_f64() {
            Some(x) if !x.is_nan() => gen.logprobs.push(x.max(-1e30)),
            _ => gen.invalid = true,
        },
    }
}

/// A non-streamed answer's generation (`from_openai`).
pub fn from_answer(data: &Value) -> Gen {
    let mut gen = Gen::default();
    let choice = &data["choices"][0];
    let entries = logprob_entries(choice);
    for e in entries {
        push_logprob(&mut gen, e);
    }
    let prompt = if data.get("prompt_token_ids").map(truthy).unwrap_or(false) {
        &data["prompt_token_ids"]
    } else {
        &choice["prompt_token_ids"]
    };
    gen.prompt_token_ids = ids(prompt, &mut gen.invalid);
    if choice.get("token_ids").map(truthy).unwrap_or(false) {
        gen.completion_token_ids = ids(&choice["token_ids"], &mut gen.invalid);
    } else {
        gen.completion_token_ids = entries
            .iter()
            .filter_map(|e| e.get("token").and_then(Value::as_str).and_then(token_id))
            .collect();
    }
    gen.finish_reason = Some(
        choice
            .get("finish_reason")
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .unwrap_or("stop")
            .to_string(),
    );
    gen.completion_tokens = data
        .get("usage")
        .and_then(|u| u.get("completion_tokens"))
        .and_then(Value::as_u64)
        .unwrap_or(entries.len() as u64);
    gen
}

fn truthy(v: &Value) -> bool {
    match v {
        Value::Null => false,
        Value::Array(a) => !a.is_empty(),
        Value::Bool(b) => *b,
        _ => true,
    }
}

/// One streamed chunk folded into `gen` (`_accumulate`).
pub fn accumulate(gen: &mut Gen, chunk: &Value) {
    if chunk.get("prompt_token_ids").map(truthy).unwrap_or(false) {
        gen.prompt_token_ids = ids(&chunk["prompt_token_ids"], &mut gen.invalid);
    }
    if let Some(choices) = chunk.get("choices").and_then(Value::as_array) {
        for choice in choices {
            let sampled = choice.get("token_ids").filter(|v| truthy(v));
            if let Some(t) = sampled {
                let more = ids(t, &mut gen.invalid);
                gen.completion_token_ids.extend(more);
            }
            for e in logprob_entries(choice) {
                push_logprob(gen, e);
                if sampled.is_none() {
                    if let Some(id) = e.get("token").and_then(Value::as_str).and_then(token_id) {
                        gen.completion_token_ids.push(id);
                    }
                }
            }
            if let Some(f) = choice.get("finish_reason").and_then(Value::as_str) {
                if !f.is_empty() {
                    gen.finish_reason = Some(f.to_string());
                }
            }
        }
    }
    if let Some(n) = chunk
        .get("usage")
        .and_then(|u| u.get("completion_tokens"))
        .and_then(Value::as_u64)
    {
        gen.completion_tokens = n;
    }
}

/// The record's JSON (None when the record would be refused).
pub fn wire(completion_id: &str, model: &str, session: Option<&str>, gen: &Gen) -> Option<Vec<u8>> {
    if gen.invalid {
        return None;
    }
    serde_json::to_vec(&Wire {
        completion_id,
        model,
        session_id: session,
        prompt_token_ids: &gen.prompt_token_ids,
        completion_token_ids: &gen.completion_token_ids,
        completion_logprobs: &gen.logprobs,
        constrained: false,
        finish_reason: gen.finish_reason.as_deref(),
        timestamp: now_utc(),
    })
    .ok()
}

/// Now as RFC 3339 with microseconds and a Z, as orjson writes `datetime.now(UTC)`.
pub fn now_utc() -> String {
    let t = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let secs = t.as_secs() as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // days since 1970-01-01 -> civil date (Howard Hinnant's algorithm)
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + if m <= 2 { 1 } else { 0 };
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{:06}Z",
        rem / 3600,
        (rem / 60) % 60,
        rem % 60,
        t.subsec_micros()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_from_vllm_fields_and_token_strings() {
        let a: Value = serde_json::from_str(
            r#"{"prompt_token_ids": [1, 2], "choices": [{"finish_reason": "length",
                "logprobs": {"content": [{"token": "token_id:7", "logprob": -0.5}]}}],
                "usage": {"completion_tokens": 1}}"#,
        )
        .unwrap();
        let g = from_answer(&a);
        assert_eq!(g.prompt_token_ids, vec![1, 2]);
        assert_eq!(g.completion_token_ids, vec![7]);
        assert_eq!(g.logprobs, vec![-0.5]);
        assert_eq!(g.finish_reason.as_deref(), Some("length"));
    }

    #[test]
    fn a_float_id_is_refused() {
        let a: Value =
            serde_json::from_str(r#"{"prompt_token_ids": [1.5], "choices": [{}]}"#).unwrap();
        assert!(wire("c", "m", None, &from_answer(&a)).is_none());
    }

    #[test]
    fn timestamp_shape() {
        let t = now_utc();
        assert_eq!(t.len(), 27, "{t}");
        assert!(t.ends_with('Z') && t.as_bytes()[10] == b'T');
    }
}
