//! The route table the Python side writes (`agentrl.serving.front.write_routes`): the
//! lineages' splits (weights, order; the salt is the lineage's name, as the gateway's), each
//! version's backend and served name, agents/profiles mapped to lineages, the API keys. Read
//! from a JSON file replaced by atomic rename; a file that does not parse keeps the old table.

use serde::Deserialize;
use std::collections::HashMap;

#[derive(Debug, Deserialize, Clone)]
pub struct Version {
    /// Base URL of the version's OpenAI-compatible server, e.g. http://127.0.0.1:8000/v1
    pub backend: String,
    /// The `model` the backend knows the version by.
    pub served_name: String,
    /// The Authorization header the backend wants (an upstream's API key), if any.
    #[serde(default)]
    pub authorization: Option<String>,
}

#[derive(Debug, Deserialize, Clone, Default)]
pub struct Split {
    #[serde(default)]
    pub weights: HashMap<String, f64>,
    #[serde(default)]
    pub order: Vec<String>,
}

#[derive(Debug, Deserialize, Clone, Default)]
pub struct Table {
    #[serde(default = "default_public")]
    pub public_name: String,
    /// lineage name -> its split (the default lineage under `public_name`)
    #[serde(default)]
    pub lineages: HashMap<String, Split>,
    #[serde(default)]
    pub versions: HashMap<String, Version>,
    #[serde(default)]
    pub by_agent: HashMap<String, String>,
    #[serde(default)]
    pub by_profile: HashMap<String, String>,
    #[serde(default)]
    pub api_keys: Vec<String>,
    /// seconds a backend has to answer (the gateway's `timeout_s`)
    #[serde(default = "default_timeout")]
    pub timeout_s: f64,
    /// chat requests in flight at once; beyond, 429 + Retry-After (the gateway's max_inflight)
    #[serde(default = "default_inflight")]
    pub max_inflight: usize,
    /// a counter the writer bumps per write (diagnostics: which table is loaded)
    #[serde(default)]
    pub generation: u64,
}

fn default_public() -> String {
    "agentrl-policy".to_string()
}

fn default_timeout() -> f64 {
    60.0
}

fn default_inflight() -> usize {
    64
}

pub enum Resolved<'a> {
    /// (version, pinned: named by its id)
    Version(&'a str, bool),
    /// the lineage has no version with weight (503)
    NotServing(String),
    /// no such model (404)
    Unknown,
}

impl Table {
    pub fn parse(text: &[u8]) -> Result<Table, String> {
        let t: Table = serde_json::from_slice(text).map_err(|e| e.to_string())?;
        for (name, split) in &t.lineages {
            for v in split.order.iter().chain(split.weights.keys()) {
                if !t.versions.contains_key(v) {
                    return Err(format!(
                        "lineage {name:?} names version {v:?} with no backend"
                    ));
                }
            }
        }
        Ok(t)
    }

    /// The lineage a request for `name` goes to (an agent/profile mapped to a lineage that
    /// routes: there), as `GatewayState.lineage_for`.
    pub fn lineage_for<'a>(
        &'a self,
        name: &'a str,
        agent: Option<&str>,
        profile: Option<&str>,
    ) -> &'a str {
        if name == self.public_name && (agent.is_some() || profile.is_some()) {
            let mapped = agent
                .and_then(|a| self.by_agent.get(a))
                .filter(|l| !l.is_empty())
                .or_else(|| profile.and_then(|p| self.by_profile.get(p)));
            if let Some(l) = mapped {
                if self
                    .lineages
                    .get(l)
                    .map(|s| s.weights.values().any(|w| *w > 0.0))
                    .unwrap_or(false)
                {
                    return l.as_str();
                }
            }
        }
        name
    }

    pub fn resolve<'a>(&'a self, name: &'a str, session: Option<&str>) -> Resolved<'a> {
        if let Some(split) = self.lineages.get(name) {
            let w = |v: &str| split.weights.get(v).copied().unwrap_or(0.0);
            return match crate::split::choose(&w, &split.order, session, name) {
                Some(v) => Resolved::Version(v, false),
                None if name == self.public_name => {
                    Resolved::NotServing("no model version is serving yet".to_string())
                }
                None => {
                    Resolved::NotServing(format!("no version of lineage '{name}' is serving yet"))
                }
            };
        }
        if name == self.public_name {
            return Resolved::NotServing("no model version is serving yet".to_string());
        }
        if let Some((id, _)) = self.versions.get_key_value(name) {
            return Resolved::Version(id.as_str(), true);
        }
        Resolved::Unknown
    }

    pub fn models(&self) -> Vec<String> {
        let mut lineages: Vec<&String> = self
            .lineages
            .keys()
            .filter(|l| **l != self.public_name)
            .collect();
        lineages.sort();
        let mut versions: Vec<&String> = self.versions.keys().collect();
        versions.sort();
        std::iter::once(&self.public_name)
            .chain(lineages)
            .chain(versions)
            .cloned()
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_split_naming_an_unknown_version_is_refused() {
        let bad = br#"{"lineages": {"agentrl-policy": {"weights": {"v9": 100}, "order": ["v9"]}}}"#;
        assert!(Table::parse(bad).is_err());
    }

    #[test]
    fn pinned_and_unknown() {
        let t = Table::parse(
            br#"{"lineages": {"agentrl-policy": {"weights": {"v1": 100}, "order": ["v1"]}},
                 "versions": {"v1": {"backend": "http://x/v1", "served_name": "m"}}}"#,
        )
        .unwrap();
        assert!(matches!(
            t.resolve("v1", None),
            Resolved::Version("v1", true)
        ));
        assert!(matches!(
            t.resolve("agentrl-policy", Some("k")),
            Resolved::Version("v1", false)
        ));
        assert!(matches!(t.resolve("nope", None), Resolved::Unknown));
    }
}
