//! Classification by an OpenAI-compatible chat endpoint, when one is configured. The answer must
//! be strict JSON; anything else is an error and the local classifier decides.
use std::time::Duration;

use anyhow::{anyhow, Context};
use serde_json::{json, Value};

use super::classify::SECTORS;
use super::state::LlmSettings;

pub struct LlmAnswer {
    pub sector: usize,
    pub importance: Option<f32>,
}

const PROMPT: &str = "Classify the memory into exactly one cognitive sector: episodic (specific events or experiences), \
semantic (facts and general knowledge), procedural (skills and how-to), emotional (feelings and preferences), \
reflective (insights and summaries). Rate its importance for long-term recall from 0 to 1. \
Answer with JSON only: {\"sector\": \"<sector>\", \"importance\": <number>}.";

pub async fn classify(
    http: &reqwest::Client,
    settings: &LlmSettings,
    content: &str,
) -> anyhow::Result<LlmAnswer> {
    let url = format!(
        "{}/chat/completions",
        settings.base_url.trim_end_matches('/')
    );
    let body = json!({
        "model": settings.model,
        "temperature": 0,
        "response_format": {"type": "json_object"},
        "messages": [
            {"role": "system", "content": PROMPT},
            {"role": "user", "content": content},
        ],
    });
    let response: Value = http
        .post(&url)
        .bearer_auth(&settings.api_key)
        .timeout(Duration::from_secs(20))
        .json(&body)
        .send()
        .await?
        .error_for_status()?
        .json()
        .await?;
    let text = response["choices"][0]["message"]["content"]
        .as_str()
        .ok_or_else(|| anyhow!("no message content in the answer"))?;
    parse_answer(text)
}

/// Parses `{"sector": "...", "importance": 0.7}` strictly.
pub fn parse_answer(text: &str) -> anyhow::Result<LlmAnswer> {
    let v: Value = serde_json::from_str(text.trim()).context("the answer is not JSON")?;
    let sector = v["sector"]
        .as_str()
        .ok_or_else(|| anyhow!("no sector in the answer"))?
        .to_lowercase();
    let sector = SECTORS
        .iter()
        .position(|s| *s == sector)
        .ok_or_else(|| anyhow!("unknown sector {sector:?}"))?;
    let importance = match &v["importance"] {
        Value::Null => None,
        n => Some(
            n.as_f64()
                .filter(|x| (0.0..=1.0).contains(x))
                .ok_or_else(|| anyhow!("importance out of range"))? as f32,
        ),
    };
    Ok(LlmAnswer { sector, importance })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strict_answers_parse_and_loose_ones_fail() {
        let a = parse_answer(r#"{"sector": "procedural", "importance": 0.8}"#).unwrap();
        assert_eq!((a.sector, a.importance), (2, Some(0.8)));
        assert!(parse_answer("procedural").is_err());
        assert!(parse_answer(r#"{"sector": "musical"}"#).is_err());
        assert!(parse_answer(r#"{"sector": "semantic", "importance": 7}"#).is_err());
    }
}
