//! The public model catalogue: LLMs with their context window, prices and capabilities.
//!
//! The source is litellm's price list (`model_prices_and_context_window_backup.json`, shipped in
//! its PyPI wheel and extracted by setup); `engram models import FILE` loads it into the `models`
//! table. Each process searches an in-memory copy (4,500 entries, well under a millisecond a
//! query), reloaded when `model_catalog.version` moves: an import in one process is seen by every
//! other within [`RECHECK`].
//!
//! Matching is per word of the query, all words required: an exact word, a word's prefix, a run
//! inside the id written without separators (`gpt4o`), or, for words of four letters or more, a
//! word one edit away (two from eight letters; a swap of two neighbours is one edit), so
//! `cluade sonet` finds Claude Sonnet.
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use serde::Deserialize;
use serde_json::{Map, Value};
use sqlx::PgPool;

use super::error::{AppError, AppResult};
use super::validate::{Fields, FromFields};
use crate::types::ModelView;

/// How often a process asks whether the catalogue changed.
pub const RECHECK: Duration = Duration::from_secs(5);

/// Capability names and the litellm flags they read.
pub const CAPABILITIES: [(&str, &str); 10] = [
    ("tools", "supports_function_calling"),
    ("parallel_tools", "supports_parallel_function_calling"),
    ("vision", "supports_vision"),
    ("json", "supports_response_schema"),
    ("caching", "supports_prompt_caching"),
    ("reasoning", "supports_reasoning"),
    ("audio_input", "supports_audio_input"),
    ("audio_output", "supports_audio_output"),
    ("pdf", "supports_pdf_input"),
    ("web_search", "supports_web_search"),
];

/// The capability names of [`CAPABILITIES`], for the API document.
#[derive(serde::Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
#[allow(dead_code)]
pub enum Capability {
    Tools,
    ParallelTools,
    Vision,
    Json,
    Caching,
    Reasoning,
    AudioInput,
    AudioOutput,
    Pdf,
    WebSearch,
}

/// Families recognised in ids, for the `family` field and the search.
const FAMILIES: [&str; 40] = [
    "gpt",
    "o1",
    "o3",
    "o4",
    "chatgpt",
    "davinci",
    "babbage",
    "claude",
    "gemini",
    "gemma",
    "palm",
    "bison",
    "llama",
    "codellama",
    "mistral",
    "mixtral",
    "codestral",
    "pixtral",
    "ministral",
    "magistral",
    "devstral",
    "qwen",
    "qwq",
    "deepseek",
    "command",
    "grok",
    "phi",
    "titan",
    "nova",
    "jamba",
    "sonar",
    "kimi",
    "glm",
    "dbrx",
    "yi",
    "falcon",
    "whisper",
    "dall",
    "imagen",
    "veo",
];

/// One entry of the source file, ready to store.
#[derive(Debug, Clone, PartialEq)]
pub struct NewModel {
    pub id: String,
    pub provider: String,
    pub mode: String,
    pub family: Option<String>,
    pub context_window: Option<i64>,
    pub max_output_tokens: Option<i64>,
    /// Exact decimal text, USD per million tokens.
    pub input_price: Option<String>,
    pub output_price: Option<String>,
    pub capabilities: Vec<String>,
    pub deprecation_date: Option<String>,
    pub source: Option<String>,
}

/// An entry left out of the catalogue, and why.
#[derive(Debug, Clone, PartialEq)]
pub struct Skipped {
    pub id: String,
    pub reason: &'static str,
}

/// A price per token as the exact decimal per million tokens: the shortest text that reads back
/// as the same `f64` (what the source file wrote), with its exponent moved by six, so 2.5e-06
/// becomes `2.5e0`, never 2.4999999999999996.
pub fn per_million(per_token: f64) -> String {
    let text = format!("{per_token:e}");
    let (mantissa, exponent) = text.split_once('e').unwrap_or((&text, "0"));
    let exponent: i32 = exponent.parse().unwrap_or(0);
    format!("{mantissa}e{}", exponent + 6)
}

/// The words of an id or a query: lower-case runs of letters and digits.
pub fn words(text: &str) -> Vec<String> {
    text.to_lowercase()
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(str::to_string)
        .collect()
}

fn family_of(id: &str) -> Option<String> {
    // The model's own name is after the last route prefix (`bedrock/us.anthropic.claude…`).
    let name = id.rsplit('/').next().unwrap_or(id);
    let name_words = words(name);
    for w in &name_words {
        // `gpt` in `gpt`, `llama` in `llama3`, `o3` alone.
        let letters: String = w.chars().take_while(|c| c.is_alphabetic()).collect();
        for family in FAMILIES {
            if *w == family || (letters == family && family.len() > 2) {
                return Some(if family == "dall" {
                    "dall-e".into()
                } else {
                    family.into()
                });
            }
        }
    }
    None
}

fn tokens(v: &Value) -> Option<i64> {
    v.as_f64().filter(|n| *n > 0.0).map(|n| n as i64)
}

/// Reads litellm's price list. Entries that are not models are skipped: the documentation entry
/// `sample_spec`, entries without a provider (`fallback_generalizations`, a routing rule), and
/// entries without a mode (Fireworks' price tiers by model size such as
/// `fireworks-ai-up-to-4b`, and two Deepgram voices that give neither mode nor limits).
pub fn parse_litellm(bytes: &[u8]) -> AppResult<(Vec<NewModel>, Vec<Skipped>)> {
    let map: Map<String, Value> = serde_json::from_slice(bytes)
        .map_err(|e| AppError::BadRequest(format!("not a litellm price list: {e}")))?;
    let mut models = Vec::with_capacity(map.len());
    let mut skipped = vec![];
    for (id, entry) in map {
        let skip = |reason| Skipped {
            id: id.clone(),
            reason,
        };
        if id == "sample_spec" {
            skipped.push(skip("the file's documentation of its fields"));
            continue;
        }
        let Some(entry) = entry.as_object() else {
            skipped.push(skip("not an object"));
            continue;
        };
        let text = |k: &str| {
            entry
                .get(k)
                .and_then(Value::as_str)
                .map(str::trim)
                .filter(|s| !s.is_empty())
        };
        let Some(provider) = text("litellm_provider") else {
            skipped.push(skip("no provider: not a model"));
            continue;
        };
        let Some(mode) = text("mode") else {
            skipped.push(skip("no mode: a price tier or an incomplete entry"));
            continue;
        };
        if id.len() > 256 {
            skipped.push(skip("id longer than 256 characters"));
            continue;
        }
        let price = |k: &str| {
            entry
                .get(k)
                .and_then(Value::as_f64)
                .filter(|p| p.is_finite() && *p >= 0.0)
                .map(per_million)
        };
        let capabilities = CAPABILITIES
            .iter()
            .filter(|(_, flag)| entry.get(*flag).and_then(Value::as_bool) == Some(true))
            .map(|(name, _)| name.to_string())
            .collect();
        let deprecation_date = text("deprecation_date")
            .filter(|d| chrono::NaiveDate::parse_from_str(d, "%Y-%m-%d").is_ok())
            .map(str::to_string);
        models.push(NewModel {
            family: family_of(&id),
            provider: provider.to_string(),
            mode: mode.to_string(),
            context_window: entry
                .get("max_input_tokens")
                .and_then(tokens)
                .or_else(|| entry.get("max_tokens").and_then(tokens)),
            max_output_tokens: entry.get("max_output_tokens").and_then(tokens),
            input_price: price("input_cost_per_token"),
            output_price: price("output_cost_per_token"),
            capabilities,
            deprecation_date,
            source: text("source").map(str::to_string),
            id,
        });
    }
    Ok((models, skipped))
}

/// What an import changed.
#[derive(Debug, Clone, PartialEq)]
pub struct ImportReport {
    pub inserted: u64,
    pub updated: u64,
    pub unchanged: u64,
    pub removed: u64,
    pub skipped: Vec<Skipped>,
}

/// Loads a litellm price list into the catalogue in one transaction: new entries are added,
/// changed ones updated in place (same id), entries the file no longer has removed.
pub async fn import(pool: &PgPool, bytes: &[u8]) -> AppResult<ImportReport> {
    let (models, skipped) = parse_litellm(bytes)?;
    let column = |f: fn(&NewModel) -> Option<String>| -> Vec<Option<String>> {
        models.iter().map(f).collect()
    };
    let ids: Vec<String> = models.iter().map(|m| m.id.clone()).collect();
    let mut tx = pool.begin().await?;
    let changed: Vec<bool> = sqlx::query_scalar(
        "insert into models as m (id, provider, mode, family, context_window, max_output_tokens,
                input_price_per_mtok, output_price_per_mtok, capabilities, deprecation_date, source)
         select id, provider, mode, family, context_window, max_output_tokens, input::numeric, output::numeric,
                case when caps = '' then '{}'::text[] else string_to_array(caps, ',') end, deprecation::date, source
         from unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::int8[], $6::int8[], $7::text[], $8::text[],
                     $9::text[], $10::text[], $11::text[])
              as t(id, provider, mode, family, context_window, max_output_tokens, input, output, caps, deprecation, source)
         on conflict (id) do update set provider = excluded.provider, mode = excluded.mode, family = excluded.family,
             context_window = excluded.context_window, max_output_tokens = excluded.max_output_tokens,
             input_price_per_mtok = excluded.input_price_per_mtok, output_price_per_mtok = excluded.output_price_per_mtok,
             capabilities = excluded.capabilities, deprecation_date = excluded.deprecation_date, source = excluded.source,
             updated_at = now()
         where (m.provider, m.mode, m.family, m.context_window, m.max_output_tokens, m.input_price_per_mtok,
                m.output_price_per_mtok, m.capabilities, m.deprecation_date, m.source)
               is distinct from
               (excluded.provider, excluded.mode, excluded.family, excluded.context_window, excluded.max_output_tokens,
                excluded.input_price_per_mtok, excluded.output_price_per_mtok, excluded.capabilities,
                excluded.deprecation_date, excluded.source)
         returning xmax = 0",
    )
    .bind(&ids)
    .bind(models.iter().map(|m| m.provider.clone()).collect::<Vec<_>>())
    .bind(models.iter().map(|m| m.mode.clone()).collect::<Vec<_>>())
    .bind(column(|m| m.family.clone()))
    .bind(models.iter().map(|m| m.context_window).collect::<Vec<_>>())
    .bind(models.iter().map(|m| m.max_output_tokens).collect::<Vec<_>>())
    .bind(column(|m| m.input_price.clone()))
    .bind(column(|m| m.output_price.clone()))
    .bind(column(|m| Some(m.capabilities.join(","))))
    .bind(column(|m| m.deprecation_date.clone()))
    .bind(column(|m| m.source.clone()))
    .fetch_all(&mut *tx)
    .await?;
    let removed = sqlx::query("delete from models where id <> all($1)")
        .bind(&ids)
        .execute(&mut *tx)
        .await?
        .rows_affected();
    let inserted = changed.iter().filter(|new| **new).count() as u64;
    let updated = changed.len() as u64 - inserted;
    if !changed.is_empty() || removed > 0 {
        sqlx::query("update model_catalog set version = version + 1, imported_at = now()")
            .execute(&mut *tx)
            .await?;
    }
    tx.commit().await?;
    Ok(ImportReport {
        inserted,
        updated,
        unchanged: models.len() as u64 - inserted - updated,
        removed,
        skipped,
    })
}

/// How results are ordered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Sort {
    /// Best match first (with no `q`: first-party ids, then by id).
    #[default]
    Relevance,
    /// Cheapest input first (then output); unpriced last.
    Price,
    /// Largest context window first; unknown last.
    Context,
}

/// A catalogue search.
#[derive(Debug, Clone, Default, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ModelQuery {
    /// Free text over id, provider and family, typo-tolerant (`claude sonnet`, `llama 70b`).
    #[param(max_length = 200)]
    pub q: Option<String>,
    /// Exact provider (`openai`, `anthropic`, `bedrock`, …).
    #[param(max_length = 100)]
    pub provider: Option<String>,
    /// `chat`, `embedding`, `completion`, `image_generation`, …
    #[param(max_length = 100)]
    pub mode: Option<String>,
    /// At least this many input tokens.
    #[param(minimum = 0, maximum = 1000000000000.0)]
    pub min_context: Option<i64>,
    /// At most this many USD per million input tokens.
    #[param(minimum = 0)]
    pub max_input_price: Option<f64>,
    /// At most this many USD per million output tokens.
    #[param(minimum = 0)]
    pub max_output_price: Option<f64>,
    /// Required capabilities: repeat the parameter or separate with commas.
    #[param(value_type = Option<Vec<Capability>>, style = Form, explode)]
    #[serde(default)]
    pub capability: Vec<String>,
    #[param(inline)]
    #[serde(default)]
    pub sort: Sort,
    #[param(minimum = 1, maximum = 100, default = 20)]
    #[serde(default)]
    pub limit: i64,
    #[param(minimum = 0, maximum = 100000, default = 0)]
    #[serde(default)]
    pub offset: i64,
}

impl FromFields for ModelQuery {
    fn from_fields(f: &mut Fields) -> Self {
        let capability_names: Vec<&str> = CAPABILITIES.iter().map(|(n, _)| *n).collect();
        ModelQuery {
            q: f.optional_str("q", 200).filter(|q| !q.is_empty()),
            provider: f.optional_str("provider", 100).filter(|p| !p.is_empty()),
            mode: f.optional_str("mode", 100).filter(|m| !m.is_empty()),
            min_context: f
                .has("min_context")
                .then(|| f.int_in("min_context", 0, 0, 1_000_000_000_000)),
            max_input_price: f.optional_number("max_input_price", 0.0, 1e9),
            max_output_price: f.optional_number("max_output_price", 0.0, 1e9),
            capability: f.query_list("capability", &capability_names),
            sort: match f
                .optional_enum("sort", &["relevance", "price", "context"])
                .as_deref()
            {
                Some("price") => Sort::Price,
                Some("context") => Sort::Context,
                _ => Sort::Relevance,
            },
            limit: f.int_in("limit", 20, 1, 100),
            offset: f.int_in("offset", 0, 0, 100_000),
        }
    }
}

struct Entry {
    model: ModelView,
    /// Words of the id, the provider and the family, as indexes into [`Loaded::vocabulary`].
    words: Vec<u32>,
    /// The id's letters and digits only, lower-case.
    compact: String,
    provider: String,
    /// A provider's own name for the model (no route prefix).
    first_party: bool,
}

/// One loaded copy of the catalogue.
pub struct Loaded {
    version: i64,
    entries: Vec<Entry>,
    /// Every distinct word of the catalogue: a query word is compared with each once, not once
    /// per model.
    vocabulary: Vec<String>,
}

impl Loaded {
    pub fn len(&self) -> usize {
        self.entries.len()
    }
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
    /// Every provider, sorted.
    pub fn providers(&self) -> Vec<String> {
        self.distinct(|m| &m.provider)
    }
    /// Every mode, sorted.
    pub fn modes(&self) -> Vec<String> {
        self.distinct(|m| &m.mode)
    }
    fn distinct(&self, f: impl Fn(&ModelView) -> &String) -> Vec<String> {
        let set: std::collections::BTreeSet<&String> =
            self.entries.iter().map(|e| f(&e.model)).collect();
        set.into_iter().cloned().collect()
    }
    /// The model a request names, as the upstream's provider calls it: its id, else the id
    /// with the provider's route prefix (`mistral/mistral-large-latest`).
    pub fn find_for(&self, model: &str, provider: Option<&str>) -> Option<&ModelView> {
        self.get(model)
            .or_else(|| provider.and_then(|p| self.get(&format!("{p}/{model}"))))
    }
    /// Chat models under their providers' own names (the route prefix taken off): of
    /// `provider`, or every provider's first-party ones.
    pub fn chat_models(&self, provider: Option<&str>) -> Vec<(String, &ModelView)> {
        let mut seen = std::collections::HashSet::new();
        self.entries
            .iter()
            .filter(|e| e.model.mode == "chat")
            .filter(|e| match provider {
                Some(p) => e.provider == p,
                None => e.first_party,
            })
            .map(|e| {
                let id = &e.model.id;
                let name = provider
                    .and_then(|p| id.strip_prefix(&format!("{p}/")))
                    .unwrap_or(id);
                (name.to_string(), &e.model)
            })
            .filter(|(name, _)| seen.insert(name.clone()))
            .collect()
    }
    pub fn get(&self, id: &str) -> Option<&ModelView> {
        self.entries
            .iter()
            .find(|e| e.model.id == id)
            .map(|e| &e.model)
    }
}

/// The process's copy of the catalogue.
pub struct ModelCatalog {
    current: RwLock<Option<Arc<Loaded>>>,
    checked: Mutex<Option<Instant>>,
    refreshing: AtomicBool,
}

impl Default for ModelCatalog {
    fn default() -> Self {
        Self {
            current: RwLock::new(None),
            checked: Mutex::new(None),
            refreshing: AtomicBool::new(false),
        }
    }
}

type Row = (
    String,
    String,
    String,
    Option<String>,
    Option<i64>,
    Option<i64>,
    Option<f64>,
    Option<f64>,
    Vec<String>,
    Option<String>,
);

async fn load(pool: &PgPool) -> AppResult<Loaded> {
    let mut tx = pool.begin().await?;
    sqlx::query("set transaction isolation level repeatable read")
        .execute(&mut *tx)
        .await?;
    let version: i64 = sqlx::query_scalar("select version from model_catalog")
        .fetch_one(&mut *tx)
        .await?;
    let rows: Vec<Row> = sqlx::query_as(
        "select id, provider, mode, family, context_window, max_output_tokens,
                input_price_per_mtok::float8, output_price_per_mtok::float8, capabilities,
                to_char(deprecation_date, 'YYYY-MM-DD')
         from models order by id",
    )
    .fetch_all(&mut *tx)
    .await?;
    tx.commit().await?;
    let mut vocabulary: Vec<String> = vec![];
    let mut index: std::collections::HashMap<String, u32> = Default::default();
    let entries = rows
        .into_iter()
        .map(
            |(id, provider, mode, family, context, max_out, input, output, caps, deprecation)| {
                let mut all = words(&id);
                all.extend(words(&provider));
                if let Some(f) = &family {
                    all.extend(words(f));
                }
                let mut all: Vec<u32> = all
                    .into_iter()
                    .map(|w| {
                        *index.entry(w.clone()).or_insert_with(|| {
                            vocabulary.push(w);
                            (vocabulary.len() - 1) as u32
                        })
                    })
                    .collect();
                all.sort_unstable();
                all.dedup();
                Entry {
                    compact: words(&id).concat(),
                    first_party: !id.contains('/'),
                    provider: provider.to_lowercase(),
                    words: all,
                    model: ModelView {
                        id,
                        provider,
                        mode,
                        family,
                        context_window: context,
                        max_output_tokens: max_out,
                        input_price_per_mtok: input,
                        output_price_per_mtok: output,
                        capabilities: caps,
                        deprecation_date: deprecation,
                    },
                }
            },
        )
        .collect();
    Ok(Loaded {
        version,
        entries,
        vocabulary,
    })
}

/// The catalogue for a search by `client` (an address), counted against the per-address
/// limit: the API's and the portal's searches share one budget.
pub async fn for_client(state: &super::state::AppState, client: &str) -> AppResult<Arc<Loaded>> {
    state
        .limiter
        .hit(
            &format!("models:{client}"),
            state.settings.limits.models_per_minute,
            Duration::from_secs(60),
        )
        .await?;
    state.models.get(&state.pool).await
}

impl ModelCatalog {
    /// The current copy: loaded on first use; afterwards a change made by any process is
    /// picked up in the background at most [`RECHECK`] later, never delaying a request.
    pub async fn get(self: &Arc<Self>, pool: &PgPool) -> AppResult<Arc<Loaded>> {
        let current = self
            .current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let Some(current) = current else {
            let loaded = Arc::new(load(pool).await?);
            *self.current.write().unwrap_or_else(|p| p.into_inner()) = Some(loaded.clone());
            *self.checked.lock().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
            return Ok(loaded);
        };
        let due = {
            let mut checked = self.checked.lock().unwrap_or_else(|p| p.into_inner());
            match *checked {
                Some(at) if at.elapsed() < RECHECK => false,
                _ => {
                    *checked = Some(Instant::now());
                    true
                }
            }
        };
        if due && !self.refreshing.swap(true, Ordering::AcqRel) {
            let (pool, version) = (pool.clone(), current.version);
            let me = self.clone();
            tokio::spawn(async move {
                let _ = me.refresh_if_changed(&pool, version).await;
                me.refreshing.store(false, Ordering::Release);
            });
        }
        Ok(current)
    }

    async fn refresh_if_changed(&self, pool: &PgPool, seen: i64) -> AppResult<()> {
        let version: i64 = sqlx::query_scalar("select version from model_catalog")
            .fetch_one(pool)
            .await?;
        if version != seen {
            self.reload(pool).await?;
        }
        Ok(())
    }

    /// Loads the catalogue again now (after an import in this process).
    pub async fn reload(&self, pool: &PgPool) -> AppResult<()> {
        let loaded = Arc::new(load(pool).await?);
        *self.current.write().unwrap_or_else(|p| p.into_inner()) = Some(loaded);
        Ok(())
    }
}

/// Optimal-string-alignment distance (a swap of neighbours is one edit), giving up past `max`.
fn edits_within(a: &str, b: &str, max: usize) -> bool {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    if a.len().abs_diff(b.len()) > max {
        return false;
    }
    let (n, m) = (a.len(), b.len());
    let mut d = vec![vec![0usize; m + 1]; n + 1];
    for (i, row) in d.iter_mut().enumerate() {
        row[0] = i;
    }
    for (j, cell) in d[0].iter_mut().enumerate() {
        *cell = j;
    }
    for i in 1..=n {
        let mut row_min = usize::MAX;
        for j in 1..=m {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            let mut v = (d[i - 1][j] + 1)
                .min(d[i][j - 1] + 1)
                .min(d[i - 1][j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                v = v.min(d[i - 2][j - 2] + 1);
            }
            d[i][j] = v;
            row_min = row_min.min(v);
        }
        if row_min > max {
            return false;
        }
    }
    d[n][m] <= max
}

/// How well a query word matches each word of the vocabulary: 3 the word itself, 2 its start,
/// 1 a word (or a word's start) one edit away, two from eight letters; 0 no match.
fn vocabulary_scores(token: &str, vocabulary: &[String]) -> Vec<f32> {
    let len = token.chars().count();
    let max = if len >= 8 { 2 } else { 1 };
    vocabulary
        .iter()
        .map(|w| {
            if w == token {
                3.0
            } else if w.starts_with(token) {
                2.0
            } else if len >= 4 {
                // The word itself, or its start as long as the token (`sonet` in `sonnet4`).
                let start: String = w.chars().take(len).collect();
                if edits_within(token, w, max) || edits_within(token, &start, max) {
                    1.0
                } else {
                    0.0
                }
            } else {
                0.0
            }
        })
        .collect()
}

/// How well one query word matches an entry; `None` when it does not.
fn word_score(token: &str, scores: &[f32], entry: &Entry) -> Option<f64> {
    let best = entry
        .words
        .iter()
        .map(|w| scores[*w as usize])
        .fold(0.0_f32, f32::max);
    if best >= 2.0 {
        return Some(f64::from(best));
    }
    // Written without separators (`gpt4o`), before a typo's weaker match.
    if token.len() >= 3 && entry.compact.contains(token) {
        return Some(1.5);
    }
    (best > 0.0).then_some(f64::from(best))
}

/// A page of results and how many matched in all.
pub struct Found<'a> {
    pub items: Vec<&'a ModelView>,
    pub total: usize,
}

/// Searches a loaded catalogue.
pub fn search<'a>(catalog: &'a Loaded, q: &ModelQuery) -> Found<'a> {
    let tokens = q.q.as_deref().map(words).unwrap_or_default();
    let token_scores: Vec<Vec<f32>> = tokens
        .iter()
        .map(|t| vocabulary_scores(t, &catalog.vocabulary))
        .collect();
    let provider = q.provider.as_deref().map(str::to_lowercase);
    let mode = q.mode.as_deref().map(str::to_lowercase);
    let q_compact = tokens.concat();
    let mut hits: Vec<(f64, &Entry)> = catalog
        .entries
        .iter()
        .filter(|e| provider.as_deref().is_none_or(|p| e.provider == p))
        .filter(|e| {
            mode.as_deref()
                .is_none_or(|m| e.model.mode.eq_ignore_ascii_case(m))
        })
        .filter(|e| {
            q.min_context
                .is_none_or(|min| e.model.context_window.is_some_and(|c| c >= min))
        })
        .filter(|e| {
            q.max_input_price
                .is_none_or(|max| e.model.input_price_per_mtok.is_some_and(|p| p <= max))
        })
        .filter(|e| {
            q.max_output_price
                .is_none_or(|max| e.model.output_price_per_mtok.is_some_and(|p| p <= max))
        })
        .filter(|e| {
            q.capability
                .iter()
                .all(|c| e.model.capabilities.iter().any(|have| have == c))
        })
        .filter_map(|e| {
            let mut score = 0.0;
            for (t, scores) in tokens.iter().zip(&token_scores) {
                score += word_score(t, scores, e)?;
            }
            if !tokens.is_empty() {
                if e.compact == q_compact {
                    score += 10.0;
                }
                // Fewer words besides the ones asked for: the closer name.
                score -= 0.05 * e.words.len() as f64;
            }
            if e.first_party {
                score += 0.5;
            }
            Some((score, e))
        })
        .collect();
    let by_id = |a: &Entry, b: &Entry| {
        a.model
            .id
            .len()
            .cmp(&b.model.id.len())
            .then_with(|| a.model.id.cmp(&b.model.id))
    };
    let price_key = |p: Option<f64>| p.unwrap_or(f64::INFINITY);
    match q.sort {
        Sort::Relevance => {
            hits.sort_by(|(sa, a), (sb, b)| sb.total_cmp(sa).then_with(|| by_id(a, b)))
        }
        Sort::Price => hits.sort_by(|(_, a), (_, b)| {
            price_key(a.model.input_price_per_mtok)
                .total_cmp(&price_key(b.model.input_price_per_mtok))
                .then_with(|| {
                    price_key(a.model.output_price_per_mtok)
                        .total_cmp(&price_key(b.model.output_price_per_mtok))
                })
                .then_with(|| by_id(a, b))
        }),
        Sort::Context => hits.sort_by(|(_, a), (_, b)| {
            b.model
                .context_window
                .unwrap_or(-1)
                .cmp(&a.model.context_window.unwrap_or(-1))
                .then_with(|| by_id(a, b))
        }),
    }
    let total = hits.len();
    let items = hits
        .into_iter()
        .skip(q.offset.max(0) as usize)
        .take(q.limit.clamp(1, 100) as usize)
        .map(|(_, e)| &e.model)
        .collect();
    Found { items, total }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prices_move_to_per_million_without_drift() {
        for (per_token, expected) in [
            (2.5e-06, 2.5),
            (1e-05, 10.0),
            (1.5e-07, 0.15),
            (3e-06, 3.0),
            (6e-07, 0.6),
            (0.0, 0.0),
            (1.25e-6, 1.25),
        ] {
            let text = per_million(per_token);
            assert_eq!(
                text.parse::<f64>().unwrap(),
                expected,
                "{per_token} -> {text}"
            );
        }
    }

    #[test]
    fn families_and_words_come_from_the_model_name() {
        assert_eq!(family_of("gpt-4o").as_deref(), Some("gpt"));
        assert_eq!(
            family_of("bedrock/us.anthropic.claude-3-5-sonnet-20240620-v1:0").as_deref(),
            Some("claude")
        );
        assert_eq!(
            family_of("together_ai/meta-llama/Llama-3.3-70B-Instruct-Turbo").as_deref(),
            Some("llama")
        );
        assert_eq!(family_of("o3-mini").as_deref(), Some("o3"));
        assert_eq!(family_of("dall-e-3").as_deref(), Some("dall-e"));
        assert_eq!(family_of("text-embedding-3-small"), None);
        assert_eq!(words("gpt-3.5-turbo"), ["gpt", "3", "5", "turbo"]);
    }

    #[test]
    fn a_swap_or_a_missing_letter_is_one_edit() {
        assert!(edits_within("cluade", "claude", 1));
        assert!(edits_within("sonet", "sonnet", 1));
        assert!(!edits_within("haiku", "sonnet", 2));
        assert!(edits_within("antrhopic", "anthropic", 2));
    }

    #[test]
    fn parsing_skips_what_is_not_a_model() {
        let file = br#"{
            "sample_spec": {"mode": "one of: chat", "litellm_provider": "one of ..."},
            "fallback_generalizations": {"mode": "chat"},
            "fireworks-ai-up-to-4b": {"litellm_provider": "fireworks_ai", "input_cost_per_token": 2e-07},
            "gpt-4o": {"litellm_provider": "openai", "mode": "chat", "max_input_tokens": 128000,
                       "max_output_tokens": 16384, "input_cost_per_token": 2.5e-06,
                       "output_cost_per_token": 1e-05, "supports_function_calling": true,
                       "supports_vision": true, "supports_response_schema": false,
                       "deprecation_date": "2026-10-01"}
        }"#;
        let (models, skipped) = parse_litellm(file).unwrap();
        assert_eq!(models.len(), 1);
        let m = &models[0];
        assert_eq!(
            (m.id.as_str(), m.provider.as_str(), m.mode.as_str()),
            ("gpt-4o", "openai", "chat")
        );
        assert_eq!(
            (m.context_window, m.max_output_tokens),
            (Some(128000), Some(16384))
        );
        assert_eq!(m.input_price.as_deref(), Some("2.5e0"));
        assert_eq!(m.output_price.as_deref(), Some("1e1"));
        assert_eq!(m.capabilities, ["tools", "vision"]);
        assert_eq!(m.deprecation_date.as_deref(), Some("2026-10-01"));
        let mut skipped_ids: Vec<_> = skipped.iter().map(|s| s.id.as_str()).collect();
        skipped_ids.sort();
        assert_eq!(
            skipped_ids,
            [
                "fallback_generalizations",
                "fireworks-ai-up-to-4b",
                "sample_spec"
            ]
        );
    }
}
