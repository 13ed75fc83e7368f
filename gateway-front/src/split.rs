//! The sticky weighted split, bit for bit as `agentrl.serving.split`: a session key hashes
//! (blake2b, 8-byte digest, of "salt\0key") to a point in [0, 1); the versions own
//! consecutive slices of that interval in the table's order (newest first). Pure functions.

/// A uniform point in [0, 1) for `key` (the same float Python's `session_point` gives).
pub fn session_point(key: &str, salt: &str) -> f64 {
    let mut state = blake2b_simd::Params::new().hash_length(8).to_state();
    state.update(salt.as_bytes());
    state.update(b"\0");
    state.update(key.as_bytes());
    let digest = state.finalize();
    let mut eight = [0u8; 8];
    eight.copy_from_slice(digest.as_bytes());
    // int / 2**64 in Python: the exact quotient rounded once; `as f64` rounds the same
    // integer once and dividing by a power of two is exact.
    (u64::from_be_bytes(eight) as f64) / 18_446_744_073_709_551_616.0
}

/// The version serving session `key` (a random point when there is none); None when no
/// version has weight. `order` fixes the slices; versions of weight <= 0 never serve.
pub fn choose<'a>(
    weights: &dyn Fn(&str) -> f64,
    order: &'a [String],
    key: Option<&str>,
    salt: &str,
) -> Option<&'a str> {
    let mut total = 0.0;
    let mut live = 0usize;
    for v in order {
        let w = weights(v);
        if w > 0.0 {
            total += w;
            live += 1;
        }
    }
    if live == 0 || total <= 0.0 {
        return None;
    }
    let point = match key {
        Some(k) if !k.is_empty() => session_point(k, salt),
        _ => rand::random::<f64>(),
    };
    let mut edge = 0.0;
    let mut last = None;
    for v in order {
        let w = weights(v);
        if w > 0.0 {
            edge += w / total;
            if point < edge {
                return Some(v.as_str());
            }
            last = Some(v.as_str());
        }
    }
    last
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn point_is_in_unit_interval_and_stable() {
        let a = session_point("session-1", "agentrl-policy");
        assert!((0.0..1.0).contains(&a));
        assert_eq!(a, session_point("session-1", "agentrl-policy"));
        assert_ne!(a, session_point("session-1", "other"));
    }

    #[test]
    fn zero_weights_never_serve() {
        let order = vec!["new".to_string(), "old".to_string()];
        let w = |v: &str| if v == "old" { 100.0 } else { 0.0 };
        for i in 0..100 {
            let k = format!("k{i}");
            assert_eq!(choose(&w, &order, Some(&k), "s"), Some("old"));
        }
        let none = |_: &str| 0.0;
        assert_eq!(choose(&none, &order, Some("k"), "s"), None);
    }
}
