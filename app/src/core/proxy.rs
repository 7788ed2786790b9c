//! The LLM proxy's domain: each account's upstream (its API key sealed with AES-256-GCM), the
//! memories injected into a chat, and the record of each proxied request. The HTTP side (the
//! OpenAI-compatible route, streaming) is `server::api::chat`.
//!
//! Injection: the query is the last user message, with the message before it when the last is
//! short ("yes, book it"); the account (or the `X-Engram-Project` project) is searched, and the
//! best memories scoring at least the minimum are listed, within the memory and token budgets,
//! in one system message placed after the request's own leading system messages.
use aes_gcm::aead::{Aead, KeyInit};
use aes_gcm::{Aes256Gcm, Nonce};
use chrono::{DateTime, Utc};
use rand::RngCore;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use sqlx::PgPool;

use super::error::{AppError, AppResult};
use super::time::iso;
use super::validate::{Fields, FromFields};
use crate::types::SearchHit;

/// The server-wide upstream, from configuration: used by accounts without their own.
#[derive(Clone)]
pub struct Upstream {
    pub base_url: String,
    pub api_key: Option<String>,
    pub model: Option<String>,
    /// The catalogue's provider name (`openai`, `anthropic`, …), for `GET /models`.
    pub provider: Option<String>,
}

impl std::fmt::Debug for Upstream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Upstream")
            .field("base_url", &self.base_url)
            .field("model", &self.model)
            .field("provider", &self.provider)
            .finish_non_exhaustive()
    }
}

/// The proxy's settings.
#[derive(Clone, Debug)]
pub struct ProxySettings {
    /// AES-256-GCM key sealing upstream API keys (`ENGRAM_SECRET_KEY`).
    pub secret_key: [u8; 32],
    /// The server-wide upstream, if configured.
    pub default_upstream: Option<Upstream>,
    /// Hosts an account's upstream may name (`ENGRAM_UPSTREAM_ALLOWED_HOSTS`); `*.example.com`
    /// matches its subdomains. Empty: any host, except that production refuses loopback and
    /// private addresses.
    pub allowed_hosts: Vec<String>,
    /// Longest wait for the upstream: the whole answer, or between two streamed chunks.
    pub timeout: std::time::Duration,
    /// Memories scoring below this are not injected.
    pub min_score: f32,
    pub production: bool,
}

impl ProxySettings {
    pub fn for_tests() -> Self {
        Self {
            secret_key: *b"engram-test-secret-key-32-bytes!",
            default_upstream: None,
            allowed_hosts: vec![],
            timeout: std::time::Duration::from_secs(30),
            min_score: DEFAULT_MIN_SCORE,
            production: false,
        }
    }
}

/// The injection's defaults: memories, tokens, and the lowest score injected. The score is the
/// search's fused score in [0, 1], which divides by every part's weight: a paraphrase with no
/// word in common and no neighbour tops out near 0.3, so the absolute floor is low, and a
/// memory must also score at least [`RELATIVE_FLOOR`] of the best hit (a memory stored beside a
/// strong hit rides on its neighbour bonus: 0.35 against the hit's 0.71 in the proxy test).
/// Not yet tuned on held-out data.
pub const DEFAULT_LIMIT: usize = 5;
pub const DEFAULT_BUDGET: usize = 1_000;
pub const DEFAULT_MIN_SCORE: f32 = 0.2;
pub const RELATIVE_FLOOR: f32 = 0.6;
pub const MAX_LIMIT: usize = 50;
pub const MAX_BUDGET: usize = 32_000;

// ---------------------------------------------------------------------------------------------
// Sealing upstream keys.

/// Encrypts `secret`: a fresh 96-bit nonce and the ciphertext (with its tag).
pub fn seal(key: &[u8; 32], secret: &str) -> (Vec<u8>, Vec<u8>) {
    let cipher = Aes256Gcm::new(key.into());
    let mut nonce = [0u8; 12];
    rand::rng().fill_bytes(&mut nonce);
    let sealed = cipher
        .encrypt(&Nonce::from(nonce), secret.as_bytes())
        .expect("AES-GCM encryption of a short secret cannot fail");
    (nonce.to_vec(), sealed)
}

/// Decrypts what [`seal`] made; an error if the key is not the one it was sealed with.
pub fn open(key: &[u8; 32], nonce: &[u8], sealed: &[u8]) -> AppResult<String> {
    let nonce: [u8; 12] = nonce
        .try_into()
        .map_err(|_| anyhow::anyhow!("a sealed key's nonce must be 12 bytes"))?;
    let cipher = Aes256Gcm::new(key.into());
    let plain = cipher.decrypt(&Nonce::from(nonce), sealed).map_err(|_| {
        anyhow::anyhow!(
            "an upstream API key does not open with ENGRAM_SECRET_KEY: was the key changed?"
        )
    })?;
    String::from_utf8(plain).map_err(|e| anyhow::anyhow!(e).into())
}

/// How a secret is shown: its first characters' kind and its last four.
pub fn mask(last4: &str) -> String {
    format!("…{last4}")
}

// ---------------------------------------------------------------------------------------------
// An account's upstream.

/// An account's upstream as set through `PUT /api/v1/proxy/settings` or the portal.
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
#[schema(example = json!({"base_url": "https://api.openai.com/v1", "api_key": "sk-…",
    "model": "gpt-4o-mini"}))]
pub struct UpstreamUpdate {
    /// The OpenAI-compatible API's base URL (the part before `/chat/completions`).
    #[schema(min_length = 8, max_length = 2048)]
    pub base_url: String,
    /// The upstream's own API key. Omitted: the stored one is kept; null or empty: none is sent.
    #[schema(max_length = 4096)]
    pub api_key: Option<String>,
    /// The model used when a request names none.
    #[schema(max_length = 256)]
    pub model: Option<String>,
    /// The provider in the model catalogue (`openai`, `anthropic`, …): `GET /api/v1/models`
    /// lists its models. Guessed from the base URL when omitted.
    #[schema(max_length = 64)]
    pub provider: Option<String>,
    #[serde(skip)]
    #[schema(ignore)]
    pub keep_key: bool,
}

impl FromFields for UpstreamUpdate {
    fn from_fields(f: &mut Fields) -> Self {
        let base_url = f.required_str("base_url", 8, 2048);
        if !base_url.is_empty() && url_host(&base_url).is_none() {
            f.error(
                "base_url",
                "url_parsing",
                "Input should be an http:// or https:// URL with a host",
                None,
            );
        }
        let keep_key = !f.has("api_key");
        let api_key = f.optional_str("api_key", 4096).filter(|k| !k.is_empty());
        UpstreamUpdate {
            base_url: base_url.trim_end_matches('/').to_string(),
            api_key,
            model: f.optional_str("model", 256).filter(|m| !m.is_empty()),
            provider: f
                .optional_str("provider", 64)
                .filter(|p| !p.is_empty())
                .map(|p| p.to_lowercase()),
            keep_key,
        }
    }
}

/// An account's upstream as shown: the key masked.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct UpstreamView {
    /// `account` (its own), `server` (the server's default) or `none`.
    pub source: String,
    pub base_url: Option<String>,
    /// The key's last four characters, or null when none is set.
    pub api_key: Option<String>,
    pub model: Option<String>,
    pub provider: Option<String>,
    pub updated_at: Option<String>,
}

/// The host of an `http(s)://host[:port]/...` URL, lower-cased.
pub fn url_host(url: &str) -> Option<String> {
    let rest = url
        .strip_prefix("https://")
        .or_else(|| url.strip_prefix("http://"))?;
    let authority = rest.split(['/', '?', '#']).next()?;
    if authority.contains('@') {
        return None;
    }
    let host = if let Some(v6) = authority.strip_prefix('[') {
        v6.split(']').next()?
    } else {
        authority.rsplit_once(':').map_or(authority, |(h, _)| h)
    };
    (!host.is_empty()).then(|| host.to_ascii_lowercase())
}

/// Whether an account may send its chats to `base_url` (see [`ProxySettings::allowed_hosts`]).
pub fn check_host(settings: &ProxySettings, base_url: &str) -> AppResult<()> {
    let host =
        url_host(base_url).ok_or_else(|| AppError::BadRequest("base_url has no host".into()))?;
    if !settings.allowed_hosts.is_empty() {
        let allowed = settings
            .allowed_hosts
            .iter()
            .any(|a| match a.strip_prefix("*.") {
                Some(domain) => host == domain || host.ends_with(&format!(".{domain}")),
                None => host == *a,
            });
        if !allowed {
            return Err(AppError::BadRequest(format!(
                "Upstream host {host} is not allowed on this server (ENGRAM_UPSTREAM_ALLOWED_HOSTS)"
            )));
        }
        return Ok(());
    }
    if settings.production && is_internal(&host) {
        return Err(AppError::BadRequest(format!(
            "Upstream host {host} is a loopback or private address, refused in production unless ENGRAM_UPSTREAM_ALLOWED_HOSTS lists it"
        )));
    }
    Ok(())
}

fn is_internal(host: &str) -> bool {
    if host == "localhost" || host.ends_with(".localhost") || host.ends_with(".internal") {
        return true;
    }
    match host.parse::<std::net::IpAddr>() {
        Ok(std::net::IpAddr::V4(ip)) => {
            ip.is_loopback() || ip.is_private() || ip.is_link_local() || ip.is_unspecified()
        }
        Ok(std::net::IpAddr::V6(ip)) => {
            ip.is_loopback() || ip.is_unspecified() || (ip.segments()[0] & 0xfe00) == 0xfc00
        }
        Err(_) => false,
    }
}

/// The catalogue's provider for a well-known API host.
pub fn provider_for(base_url: &str) -> Option<String> {
    let host = url_host(base_url)?;
    let known = [
        ("api.openai.com", "openai"),
        ("api.anthropic.com", "anthropic"),
        ("api.mistral.ai", "mistral"),
        ("api.groq.com", "groq"),
        ("api.deepseek.com", "deepseek"),
        ("openrouter.ai", "openrouter"),
        ("api.together.xyz", "together_ai"),
        ("api.fireworks.ai", "fireworks_ai"),
        ("generativelanguage.googleapis.com", "gemini"),
        ("api.x.ai", "xai"),
        ("api.cohere.com", "cohere_chat"),
        ("api.perplexity.ai", "perplexity"),
    ];
    known
        .iter()
        .find(|(h, _)| host == *h || host.ends_with(&format!(".{h}")))
        .map(|(_, p)| p.to_string())
}

/// Stores the account's upstream (the key sealed).
pub async fn put_upstream(
    pool: &PgPool,
    settings: &ProxySettings,
    user_id: i64,
    update: &UpstreamUpdate,
) -> AppResult<UpstreamView> {
    check_host(settings, &update.base_url)?;
    let provider = update
        .provider
        .clone()
        .or_else(|| provider_for(&update.base_url));
    let (nonce, sealed, last4) = match &update.api_key {
        Some(key) => {
            let (nonce, sealed) = seal(&settings.secret_key, key);
            let chars: Vec<char> = key.chars().collect();
            let last4: String = chars[chars.len().saturating_sub(4)..].iter().collect();
            (Some(nonce), Some(sealed), Some(last4))
        }
        None => (None, None, None),
    };
    sqlx::query(
        "insert into proxy_settings (user_id, base_url, provider, model, api_key_nonce, api_key_sealed, api_key_last4)
         values ($1, $2, $3, $4, $5, $6, $7)
         on conflict (user_id) do update set base_url = excluded.base_url, provider = excluded.provider,
             model = excluded.model, updated_at = now(),
             api_key_nonce = case when $8 then proxy_settings.api_key_nonce else excluded.api_key_nonce end,
             api_key_sealed = case when $8 then proxy_settings.api_key_sealed else excluded.api_key_sealed end,
             api_key_last4 = case when $8 then proxy_settings.api_key_last4 else excluded.api_key_last4 end",
    )
    .bind(user_id)
    .bind(&update.base_url)
    .bind(&provider)
    .bind(&update.model)
    .bind(nonce)
    .bind(sealed)
    .bind(last4)
    .bind(update.keep_key)
    .execute(pool)
    .await?;
    view_upstream(pool, settings, user_id).await
}

/// Forgets the account's upstream (the server's default, if any, applies again).
pub async fn delete_upstream(pool: &PgPool, user_id: i64) -> AppResult<bool> {
    Ok(sqlx::query("delete from proxy_settings where user_id = $1")
        .bind(user_id)
        .execute(pool)
        .await?
        .rows_affected()
        > 0)
}

type UpstreamRow = (
    String,
    Option<String>,
    Option<String>,
    Option<Vec<u8>>,
    Option<Vec<u8>>,
    Option<String>,
    DateTime<Utc>,
);

async fn upstream_row(pool: &PgPool, user_id: i64) -> AppResult<Option<UpstreamRow>> {
    Ok(sqlx::query_as(
        "select base_url, provider, model, api_key_nonce, api_key_sealed, api_key_last4, updated_at
         from proxy_settings where user_id = $1",
    )
    .bind(user_id)
    .fetch_optional(pool)
    .await?)
}

/// The account's upstream as shown (the key masked), or the server's default.
pub async fn view_upstream(
    pool: &PgPool,
    settings: &ProxySettings,
    user_id: i64,
) -> AppResult<UpstreamView> {
    Ok(match upstream_row(pool, user_id).await? {
        Some((base_url, provider, model, _, _, last4, updated_at)) => UpstreamView {
            source: "account".into(),
            base_url: Some(base_url),
            api_key: last4.as_deref().map(mask),
            model,
            provider,
            updated_at: Some(iso(updated_at)),
        },
        None => match &settings.default_upstream {
            Some(u) => UpstreamView {
                source: "server".into(),
                base_url: Some(u.base_url.clone()),
                api_key: u.api_key.as_ref().map(|_| "(the server's)".to_string()),
                model: u.model.clone(),
                provider: u.provider.clone(),
                updated_at: None,
            },
            None => UpstreamView {
                source: "none".into(),
                base_url: None,
                api_key: None,
                model: None,
                provider: None,
                updated_at: None,
            },
        },
    })
}

/// The upstream a request of the account goes to (its key opened), if any.
pub async fn upstream_for(
    pool: &PgPool,
    settings: &ProxySettings,
    user_id: i64,
) -> AppResult<Option<Upstream>> {
    match upstream_row(pool, user_id).await? {
        Some((base_url, provider, model, nonce, sealed, _, _)) => {
            let api_key = match (nonce, sealed) {
                (Some(n), Some(s)) => Some(open(&settings.secret_key, &n, &s)?),
                _ => None,
            };
            Ok(Some(Upstream {
                base_url,
                api_key,
                model,
                provider,
            }))
        }
        None => Ok(settings.default_upstream.clone()),
    }
}

// ---------------------------------------------------------------------------------------------
// Injection.

/// The text of a chat message's `content`: a string, or the text parts of a list.
pub fn content_text(message: &Value) -> String {
    match &message["content"] {
        Value::String(s) => s.clone(),
        Value::Array(parts) => parts
            .iter()
            .filter_map(|p| p["text"].as_str())
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    }
}

/// A user message shorter than this many words takes the message before it into the query.
const SHORT_QUERY_WORDS: usize = 8;
/// Longest search query taken from a chat, in characters.
const MAX_QUERY_CHARS: usize = 2_000;

/// The search query for a chat: the last user message, with the message before it when the
/// last is short. `None` when there is no user message with text.
pub fn query_for(messages: &[Value]) -> Option<String> {
    let last = messages.iter().rposition(|m| m["role"] == "user")?;
    let text = content_text(&messages[last]);
    if text.trim().is_empty() {
        return None;
    }
    let mut query = text.trim().to_string();
    if query.split_whitespace().count() < SHORT_QUERY_WORDS && last > 0 {
        let before = content_text(&messages[last - 1]);
        if !before.trim().is_empty() && messages[last - 1]["role"] != "system" {
            query = format!("{}\n{query}", before.trim());
        }
    }
    if query.chars().count() > MAX_QUERY_CHARS {
        // Keep the end: the user's own words.
        let skip = query.chars().count() - MAX_QUERY_CHARS;
        query = query.chars().skip(skip).collect();
    }
    Some(query)
}

/// Tokens of a text, estimated as OpenAI's rule of thumb: four characters a token.
pub fn estimate_tokens(text: &str) -> usize {
    text.chars().count().div_ceil(4)
}

/// A memory injected into a chat, as the answer's header and the portal show it.
pub use crate::types::InjectedMemory as Injected;

const INJECTION_HEADER: &str = "Relevant memories about the user, from earlier conversations \
(most relevant first; each with the date it was recorded). Use them when they help; do not \
mention this list unless asked.";

/// The memories to inject from search hits (best first): at most `limit`, each scoring at
/// least `min_score` and [`RELATIVE_FLOOR`] of the best, within `budget` tokens for the whole
/// message; and the system message.
pub fn injection(
    hits: &[SearchHit],
    limit: usize,
    budget: usize,
    min_score: f32,
) -> (Vec<Injected>, Option<Value>) {
    let mut text = INJECTION_HEADER.to_string();
    let mut used = estimate_tokens(&text);
    let mut chosen = vec![];
    let best = hits.iter().map(|h| h.score).fold(0.0, f32::max);
    let floor = min_score.max(best * RELATIVE_FLOOR);
    for hit in hits.iter().filter(|h| h.score >= floor) {
        if chosen.len() >= limit {
            break;
        }
        let day = hit.created_at.get(..10).unwrap_or(&hit.created_at);
        let line = format!("\n- [{day}] {}", hit.content.trim());
        let cost = estimate_tokens(&line);
        if used + cost > budget {
            // A shorter memory further down may still fit.
            continue;
        }
        used += cost;
        text.push_str(&line);
        chosen.push(Injected {
            id: hit.id.clone(),
            content: hit.content.clone(),
            score: hit.score,
            created_at: hit.created_at.clone(),
        });
    }
    if chosen.is_empty() {
        return (chosen, None);
    }
    (chosen, Some(json!({"role": "system", "content": text})))
}

/// Puts `message` after the leading system (and developer) messages.
pub fn insert_after_system(messages: &mut Vec<Value>, message: Value) {
    let at = messages
        .iter()
        .position(|m| m["role"] != "system" && m["role"] != "developer")
        .unwrap_or(messages.len());
    messages.insert(at, message);
}

// ---------------------------------------------------------------------------------------------
// The record of a request.

/// What one proxied request cost, recorded once it has ended.
#[derive(Debug, Clone, Default)]
pub struct Usage {
    pub user_id: i64,
    pub model: String,
    pub conversation_id: Option<uuid::Uuid>,
    pub stream: bool,
    pub status: u16,
    pub prompt_tokens: i64,
    pub completion_tokens: i64,
    pub estimated: bool,
    pub cost_usd: Option<f64>,
    pub injected: usize,
    pub first_byte_ms: Option<f64>,
    pub total_ms: f64,
}

/// USD for the tokens at the catalogue's prices (per million tokens), if it lists both.
pub fn cost(model: Option<&crate::types::ModelView>, prompt: i64, completion: i64) -> Option<f64> {
    let m = model?;
    let input = m.input_price_per_mtok?;
    let output = m.output_price_per_mtok.unwrap_or(0.0);
    Some((prompt as f64 * input + completion as f64 * output) / 1e6)
}

pub async fn record(pool: &PgPool, u: &Usage) -> AppResult<()> {
    sqlx::query(
        "insert into proxy_requests (user_id, model, conversation_id, stream, status, prompt_tokens,
             completion_tokens, tokens_estimated, cost_usd, memories_injected, first_byte_ms, total_ms)
         values ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)",
    )
    .bind(u.user_id)
    .bind(&u.model)
    .bind(u.conversation_id)
    .bind(u.stream)
    .bind(i32::from(u.status))
    .bind(u.prompt_tokens.min(i32::MAX as i64) as i32)
    .bind(u.completion_tokens.min(i32::MAX as i64) as i32)
    .bind(u.estimated)
    .bind(u.cost_usd)
    .bind(u.injected as i32)
    .bind(u.first_byte_ms.map(|v| v as f32))
    .bind(u.total_ms as f32)
    .execute(pool)
    .await?;
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// A proxied request: prepared (upstream, memories, conversation), then finished (recorded,
// remembered). The API's route and the portal's chat page share both.

/// The proxy's controls (the `X-Engram-*` headers on the API).
#[derive(Debug, Clone)]
pub struct Controls {
    pub inject: bool,
    pub remember: bool,
    /// A project's id or name: searched, and remembered into.
    pub project: Option<String>,
    /// A conversation: one of ours (its id) or the client's own id for one.
    pub conversation: Option<String>,
    pub limit: usize,
    pub budget: usize,
}

impl Default for Controls {
    fn default() -> Self {
        Self {
            inject: true,
            remember: true,
            project: None,
            conversation: None,
            limit: DEFAULT_LIMIT,
            budget: DEFAULT_BUDGET,
        }
    }
}

/// Why a request cannot be sent upstream.
#[derive(Debug)]
pub enum Refused {
    App(AppError),
    /// Neither the account nor the server has an upstream.
    NoUpstream,
    /// The request names no model and the upstream has no default.
    NoModel,
}

impl From<AppError> for Refused {
    fn from(e: AppError) -> Self {
        Refused::App(e)
    }
}

impl Refused {
    pub fn message(&self) -> String {
        match self {
            Refused::App(e) => e.user_message(),
            Refused::NoUpstream => "No upstream LLM is configured for this account: set one with PUT /api/v1/proxy/settings (base_url, api_key, model) or on the portal's Chat page".into(),
            Refused::NoModel => "model is required: name one, or set the account's default model in its proxy settings".into(),
        }
    }
}

/// A request ready to go upstream.
pub struct Prepared {
    pub upstream: Upstream,
    /// The body to send: the model filled in, the memories injected.
    pub body: serde_json::Map<String, Value>,
    pub injected: Vec<Injected>,
    /// The conversation the exchange is appended to (or would be, when remembering is off
    /// and one was named).
    pub conversation_id: Option<uuid::Uuid>,
    /// Set when the catalogue does not list the model.
    pub warning: Option<String>,
    pub exchange: Exchange,
}

/// The upstream HTTP client: connections kept alive, a connect timeout; each request sets its
/// own overall or per-chunk limits.
pub fn upstream_client() -> &'static reqwest::Client {
    static CLIENT: std::sync::OnceLock<reqwest::Client> = std::sync::OnceLock::new();
    CLIENT.get_or_init(|| {
        reqwest::Client::builder()
            .connect_timeout(std::time::Duration::from_secs(10))
            .pool_idle_timeout(std::time::Duration::from_secs(60))
            .build()
            .expect("building the upstream client")
    })
}

/// Finds the upstream, the memories to inject and the conversation (side by side), and builds
/// the body to send. `body` is an OpenAI request already checked to have `messages`.
pub async fn prepare(
    state: &super::state::AppState,
    user_id: i64,
    controls: &Controls,
    mut body: serde_json::Map<String, Value>,
) -> Result<Prepared, Refused> {
    use super::conversations::{self, Target};
    let started = std::time::Instant::now();
    let stream = body.get("stream").and_then(Value::as_bool).unwrap_or(false);
    let messages: Vec<Value> = body["messages"].as_array().cloned().unwrap_or_default();
    let user_text = messages
        .iter()
        .rev()
        .find(|m| m["role"] == "user")
        .map(content_text);
    let query = if controls.inject {
        query_for(&messages)
    } else {
        None
    };
    let pool = &state.pool;

    let upstream = upstream_for(pool, &state.settings.proxy, user_id);
    let memories = async {
        let project = match &controls.project {
            Some(p) => Some(super::projects::resolve(pool, user_id, p).await?),
            None => None,
        };
        let hits = match &query {
            Some(q) => {
                let limit = (controls.limit as i64 * 2).max(10);
                super::search::search(pool, &state.embedder, user_id, project.as_deref(), q, limit)
                    .await?
                    .0
            }
            None => vec![],
        };
        Ok::<_, AppError>((project, hits))
    };
    let conversation = async {
        match &controls.conversation {
            Some(c) => conversations::find(pool, user_id, c).await,
            None => Ok(None),
        }
    };
    let (upstream, memories, conversation) = tokio::join!(upstream, memories, conversation);
    let upstream = upstream?.ok_or(Refused::NoUpstream)?;
    let (project, hits) = memories?;
    let conversation = conversation?;

    let (injected, message) = injection(
        &hits,
        controls.limit,
        controls.budget,
        state.settings.proxy.min_score,
    );
    let mut upstream_messages = messages;
    if let Some(message) = message {
        insert_after_system(&mut upstream_messages, message);
    }
    let model = match body
        .get("model")
        .and_then(Value::as_str)
        .filter(|m| !m.is_empty())
    {
        Some(m) => m.to_string(),
        None => upstream.model.clone().ok_or(Refused::NoModel)?,
    };
    let prompt_estimate = upstream_messages
        .iter()
        .map(|m| estimate_tokens(&content_text(m)) as i64 + 4)
        .sum();
    // The plan's monthly proxy tokens: the prompt must fit (402 otherwise); the reply's tokens
    // are counted when it has ended.
    let tokens = state
        .quotas
        .charge(
            pool,
            &state.stats,
            user_id,
            super::plans::Quota::ProxyTokensPerMonth,
            prompt_estimate,
        )
        .await?;
    body.insert("model".into(), Value::String(model.clone()));
    body.insert("messages".into(), Value::Array(upstream_messages));

    // Where the exchange goes: the conversation named (ours, or the client's own id for one),
    // else a new one; none when not remembering.
    let remember_project = project.unwrap_or_else(|| super::projects::DEFAULT.to_string());
    let (target, conversation_id) = match (controls.remember, conversation, &controls.conversation)
    {
        (_, Some(id), _) => (controls.remember.then_some(Target::Id(id)), Some(id)),
        // One of ours that does not exist yet: the previous turn's, still being appended (or
        // an id the client made): created with that id when this exchange is appended.
        (true, None, Some(named)) if uuid::Uuid::parse_str(named).is_ok() => {
            let id = uuid::Uuid::parse_str(named).expect("checked");
            (
                Some(Target::New {
                    id,
                    project: remember_project,
                }),
                Some(id),
            )
        }
        (true, None, Some(external)) => {
            let target = Target::External {
                id: external.clone(),
                project: remember_project,
            };
            // Made now, so its id can be answered.
            let done = conversations::append(state, user_id, &target, &[], false).await?;
            (
                Some(Target::Id(done.conversation_id)),
                Some(done.conversation_id),
            )
        }
        (true, None, None) => {
            let id = uuid::Uuid::new_v4();
            (
                Some(Target::New {
                    id,
                    project: remember_project,
                }),
                Some(id),
            )
        }
        (false, None, _) => (None, None),
    };

    let catalogue = state.models.get(pool).await.ok();
    let model_info = catalogue
        .as_ref()
        .and_then(|c| c.find_for(&model, upstream.provider.as_deref()).cloned());
    let warning = (catalogue.is_some() && model_info.is_none())
        .then(|| format!("model {model:?} is not in the model catalogue: its cost is not counted"));
    Ok(Prepared {
        upstream,
        body,
        injected: injected.clone(),
        conversation_id,
        warning,
        exchange: Exchange {
            state: state.clone(),
            user_id,
            model,
            model_info,
            stream,
            started,
            user_text,
            prompt_estimate,
            tokens,
            injected: injected.len(),
            target,
            conversation_id,
        },
    })
}

/// Everything a finished exchange needs to be recorded and remembered.
pub struct Exchange {
    state: super::state::AppState,
    user_id: i64,
    model: String,
    model_info: Option<crate::types::ModelView>,
    stream: bool,
    pub started: std::time::Instant,
    user_text: Option<String>,
    prompt_estimate: i64,
    /// The plan's proxy tokens let through for the prompt; settled with the real count.
    tokens: super::plans::Charge,
    injected: usize,
    /// Where to append the exchange (`None`: not remembered).
    target: Option<super::conversations::Target>,
    conversation_id: Option<uuid::Uuid>,
}

impl Exchange {
    /// Records the request (with `status`) and, with `remember`, appends the user's turn and
    /// the reply (if any) to the conversation. `usage` is the upstream's count, if it sent one
    /// (else the tokens are estimated).
    pub async fn finish(
        self,
        status: u16,
        remember: bool,
        reply: Option<String>,
        usage: Option<(i64, i64)>,
        first_byte: Option<std::time::Duration>,
    ) {
        use super::conversations::{self, NewMessage, MAX_CONTENT};
        let completion_estimate = reply.as_deref().map_or(0, estimate_tokens) as i64;
        let (prompt, completion, estimated) = match usage {
            Some((p, c)) => (p, c, false),
            None => (self.prompt_estimate, completion_estimate, true),
        };
        let record_row = Usage {
            user_id: self.user_id,
            model: self.model.clone(),
            conversation_id: self.conversation_id,
            stream: self.stream,
            status,
            prompt_tokens: prompt,
            completion_tokens: completion,
            estimated,
            cost_usd: cost(self.model_info.as_ref(), prompt, completion),
            injected: self.injected,
            first_byte_ms: first_byte.map(|d| d.as_secs_f64() * 1e3),
            total_ms: self.started.elapsed().as_secs_f64() * 1e3,
        };
        if let Err(e) = record(&self.state.pool, &record_row).await {
            tracing::warn!(error = %e, "recording a proxied request");
        }
        self.tokens.done_with(prompt + completion);
        let Some(target) = self.target.filter(|_| remember) else {
            return;
        };
        let now = Utc::now();
        let message = |role: &str, text: &str| NewMessage {
            role: role.into(),
            content: text.chars().take(MAX_CONTENT).collect(),
            name: None,
            timestamp: Some(now),
            tokens: None,
        };
        let mut messages = vec![];
        if let Some(text) = self.user_text.as_deref().filter(|t| !t.trim().is_empty()) {
            messages.push(message("user", text.trim()));
        }
        if let Some(text) = reply.as_deref().filter(|t| !t.trim().is_empty()) {
            messages.push(message("assistant", text.trim()));
        }
        if messages.is_empty() {
            return;
        }
        if let Err(e) =
            conversations::append(&self.state, self.user_id, &target, &messages, false).await
        {
            tracing::warn!(error = %e, "remembering a proxied exchange");
        }
    }
}

/// A whole (not streamed) answer of the upstream.
pub struct Answered {
    pub reply: Option<String>,
    pub usage: Option<(i64, i64)>,
    pub first_byte: std::time::Duration,
}

/// Sends a prepared body upstream without streaming and reads the reply (the portal's chat):
/// the reply, or the status to record and a message to show.
pub async fn complete_once(
    state: &super::state::AppState,
    upstream: Upstream,
    mut body: serde_json::Map<String, Value>,
) -> Result<Answered, (u16, String)> {
    let started = std::time::Instant::now();
    let timeout = state.settings.proxy.timeout;
    body.insert("stream".into(), Value::Bool(false));
    let url = format!(
        "{}/chat/completions",
        upstream.base_url.trim_end_matches('/')
    );
    let mut request = upstream_client().post(&url).json(&Value::Object(body));
    if let Some(key) = &upstream.api_key {
        request = request.bearer_auth(key);
    }
    let answer = tokio::time::timeout(timeout, async {
        let response = request.send().await.map_err(|e| {
            tracing::warn!(error = %e, url, "upstream unreachable");
            (
                502,
                format!(
                    "The upstream LLM at {} cannot be reached",
                    upstream.base_url
                ),
            )
        })?;
        let status = response.status();
        let first_byte = started.elapsed();
        let v: Value = response.json().await.unwrap_or(Value::Null);
        if !status.is_success() {
            let detail = v["error"]["message"]
                .as_str()
                .unwrap_or("no detail")
                .to_string();
            return Err((
                status.as_u16(),
                format!("The upstream LLM answered {status}: {detail}"),
            ));
        }
        Ok(Answered {
            reply: v["choices"][0]["message"]["content"]
                .as_str()
                .map(str::to_string),
            usage: usage_of(&v),
            first_byte,
        })
    })
    .await;
    answer.unwrap_or_else(|_| {
        Err((
            504,
            format!(
                "The upstream LLM did not answer within {} s",
                timeout.as_secs()
            ),
        ))
    })
}

/// `usage.prompt_tokens` and `usage.completion_tokens` of an answer or a chunk.
pub fn usage_of(v: &Value) -> Option<(i64, i64)> {
    let u = v.get("usage")?;
    Some((
        u["prompt_tokens"].as_i64()?,
        u["completion_tokens"].as_i64()?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hit(id: &str, content: &str, score: f32) -> SearchHit {
        SearchHit {
            id: id.into(),
            content: content.into(),
            score,
            cognitive_sector: "semantic".into(),
            importance_score: 0.5,
            project_id: "default".into(),
            metadata: Value::Null,
            created_at: "2026-11-20T10:00:00.000Z".into(),
            category: "semantic".into(),
        }
    }

    #[test]
    fn keys_seal_and_open_only_with_their_key() {
        let key = [7u8; 32];
        let (nonce, sealed) = seal(&key, "sk-upstream-secret");
        assert!(!sealed.windows(6).any(|w| w == b"secret"));
        assert_eq!(open(&key, &nonce, &sealed).unwrap(), "sk-upstream-secret");
        assert!(open(&[8u8; 32], &nonce, &sealed).is_err());
        let (nonce2, sealed2) = seal(&key, "sk-upstream-secret");
        assert_ne!(
            (nonce, sealed),
            (nonce2, sealed2),
            "a fresh nonce each time"
        );
    }

    #[test]
    fn the_query_is_the_last_user_message_with_context_when_short() {
        let msgs = vec![
            json!({"role": "system", "content": "Be brief."}),
            json!({"role": "user", "content": "Where should we eat tonight in Lisbon?"}),
            json!({"role": "assistant", "content": "Cervejaria Ramiro is popular for seafood."}),
            json!({"role": "user", "content": "Is it safe for me?"}),
        ];
        let q = query_for(&msgs).unwrap();
        assert!(q.starts_with("Cervejaria Ramiro"), "{q}");
        assert!(q.ends_with("Is it safe for me?"), "{q}");
        let long = vec![
            json!({"role": "user", "content": [{"type": "text", "text": "What do I usually order when I go out for dinner with friends?"}]}),
        ];
        assert_eq!(
            query_for(&long).unwrap(),
            "What do I usually order when I go out for dinner with friends?"
        );
        assert!(query_for(&[json!({"role": "system", "content": "x"})]).is_none());
    }

    #[test]
    fn injection_keeps_the_best_above_the_floor_within_the_budget() {
        let hits = vec![
            hit("a", "Ana is allergic to peanuts", 0.8),
            hit("b", &"very long memory ".repeat(100), 0.7),
            hit("c", "Ana lives in Lisbon", 0.6),
            hit("d", "unrelated", 0.1),
        ];
        let (chosen, message) = injection(&hits, 5, 200, 0.3);
        let ids: Vec<&str> = chosen.iter().map(|c| c.id.as_str()).collect();
        assert_eq!(ids, ["a", "c"], "b is over the budget, d under the floor");
        let text = message.unwrap()["content"].as_str().unwrap().to_string();
        assert!(
            text.contains("- [2026-11-20] Ana is allergic to peanuts"),
            "{text}"
        );
        let (one, _) = injection(&hits, 1, 1000, 0.3);
        assert_eq!(one.len(), 1);
        let (none, message) = injection(&hits, 5, 1000, 0.9);
        assert!(none.is_empty() && message.is_none());
        // Far below the best hit: left out even above the floor.
        let riding = vec![
            hit("a", "Mia's allergy", 0.71),
            hit("b", "budget review", 0.35),
        ];
        let (chosen, _) = injection(&riding, 5, 1000, 0.2);
        assert_eq!(chosen.len(), 1);
    }

    #[test]
    fn the_memories_go_after_the_system_prompt() {
        let mut msgs = vec![
            json!({"role": "system", "content": "Be brief."}),
            json!({"role": "user", "content": "hi"}),
        ];
        insert_after_system(&mut msgs, json!({"role": "system", "content": "memories"}));
        assert_eq!(msgs[1]["content"], "memories");
        let mut no_system = vec![json!({"role": "user", "content": "hi"})];
        insert_after_system(
            &mut no_system,
            json!({"role": "system", "content": "memories"}),
        );
        assert_eq!(no_system[0]["content"], "memories");
    }

    #[test]
    fn hosts_are_checked_against_the_allow_list_and_internal_addresses() {
        let mut s = ProxySettings::for_tests();
        assert_eq!(
            url_host("https://api.openai.com/v1").as_deref(),
            Some("api.openai.com")
        );
        assert_eq!(
            url_host("http://127.0.0.1:8080/v1").as_deref(),
            Some("127.0.0.1")
        );
        assert_eq!(url_host("http://[::1]:8080").as_deref(), Some("::1"));
        assert!(url_host("ftp://x").is_none() && url_host("http://user@evil").is_none());
        assert!(
            check_host(&s, "http://127.0.0.1:9/v1").is_ok(),
            "development allows loopback"
        );
        s.production = true;
        assert!(check_host(&s, "http://127.0.0.1:9/v1").is_err());
        assert!(check_host(&s, "http://10.1.2.3/v1").is_err());
        assert!(check_host(&s, "https://api.openai.com/v1").is_ok());
        s.allowed_hosts = vec!["*.openai.com".into(), "127.0.0.1".into()];
        assert!(check_host(&s, "http://127.0.0.1:9/v1").is_ok());
        assert!(check_host(&s, "https://api.openai.com/v1").is_ok());
        assert!(check_host(&s, "https://api.mistral.ai/v1").is_err());
        assert_eq!(
            provider_for("https://api.openai.com/v1").as_deref(),
            Some("openai")
        );
        assert_eq!(provider_for("http://127.0.0.1:11434/v1"), None);
    }
}
