//! Configuration from environment variables (each documented in README.md with its default).
use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::{bail, Context};
use app::core::proxy::{self, ProxySettings, Upstream};
use app::core::state::{BillingSettings, ClaimLimits, LimitSettings, LlmSettings, Settings};
use sha2::Digest;

/// Everything the process reads from its environment.
#[derive(Debug, Clone)]
pub struct Config {
    /// `DATABASE_URL`.
    pub database_url: String,
    /// `ENGRAM_BIND`: address to serve on.
    pub bind: SocketAddr,
    /// `ENGRAM_MODEL_DIR`: the all-MiniLM-L6-v2 files.
    pub model_dir: PathBuf,
    /// `ENGRAM_MODEL_CATALOG`: litellm's price list, imported when the catalogue is empty.
    pub model_catalog: PathBuf,
    /// `ENGRAM_SITE_ROOT`: the built portal assets (`pkg/`, CSS).
    pub site_root: PathBuf,
    /// `ENGRAM_WORKER_CONCURRENCY`: jobs one worker process runs at once.
    pub worker_concurrency: usize,
    /// `ENGRAM_FAILPOINT_INGEST_DELAY_MS` (development mode only): a pause inside every job.
    pub failpoint_ingest_delay_ms: u64,
    /// `ENGRAM_WORKER_HEARTBEAT_SECS`: how often workers report; a job of a worker silent for
    /// two beats is handed to another.
    pub heartbeat_secs: u64,
    /// `ENGRAM_METRICS_BIND`: where `GET /metrics` is served (`off`: nowhere).
    pub metrics_bind: Option<SocketAddr>,
    /// `ENGRAM_QUERY_CACHE`: search-query embeddings kept per generation (0: none).
    pub query_cache: usize,
    /// The settings the domain reads.
    pub settings: Settings,
}

fn var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

fn parse<T: std::str::FromStr>(name: &str, default: T) -> anyhow::Result<T>
where
    T::Err: std::fmt::Display,
{
    match var(name) {
        Some(v) => v
            .parse()
            .map_err(|e| anyhow::anyhow!("{name}={v:?} is not valid: {e}")),
        None => Ok(default),
    }
}

/// The LLM proxy's settings: `ENGRAM_SECRET_KEY` (required in production), the server-wide
/// upstream (`ENGRAM_UPSTREAM_BASE_URL`, `_API_KEY`, `_MODEL`, `_PROVIDER`),
/// `ENGRAM_UPSTREAM_ALLOWED_HOSTS`, `ENGRAM_UPSTREAM_TIMEOUT_SECS`, `ENGRAM_PROXY_MIN_SCORE`.
fn proxy_settings(production: bool, jwt_secret: &[u8]) -> anyhow::Result<ProxySettings> {
    let secret_key: [u8; 32] = match var("ENGRAM_SECRET_KEY") {
        Some(hex_key) => hex::decode(hex_key.trim())
            .ok()
            .and_then(|k| <[u8; 32]>::try_from(k).ok())
            .ok_or_else(|| anyhow::anyhow!("ENGRAM_SECRET_KEY must be 64 hexadecimal characters (32 bytes; e.g. `openssl rand -hex 32`)"))?,
        None if production => bail!("ENGRAM_SECRET_KEY is not set: production mode needs a key for sealing upstream API keys (e.g. `openssl rand -hex 32`)"),
        // Development: derived from the JWT secret, so sealed keys survive a restart.
        None => sha2::Sha256::digest([b"engram-upstream-keys:".as_slice(), jwt_secret].concat()).into(),
    };
    let default_upstream = var("ENGRAM_UPSTREAM_BASE_URL").map(|base_url| {
        let base_url = base_url.trim_end_matches('/').to_string();
        Upstream {
            provider: var("ENGRAM_UPSTREAM_PROVIDER").or_else(|| proxy::provider_for(&base_url)),
            api_key: var("ENGRAM_UPSTREAM_API_KEY"),
            model: var("ENGRAM_UPSTREAM_MODEL"),
            base_url,
        }
    });
    let min_score: f32 = parse("ENGRAM_PROXY_MIN_SCORE", proxy::DEFAULT_MIN_SCORE)?;
    if !(0.0..=1.0).contains(&min_score) {
        bail!("ENGRAM_PROXY_MIN_SCORE must be between 0 and 1");
    }
    Ok(ProxySettings {
        secret_key,
        default_upstream,
        allowed_hosts: var("ENGRAM_UPSTREAM_ALLOWED_HOSTS")
            .unwrap_or_default()
            .split(',')
            .map(|h| h.trim().to_ascii_lowercase())
            .filter(|h| !h.is_empty())
            .collect(),
        timeout: std::time::Duration::from_secs(parse("ENGRAM_UPSTREAM_TIMEOUT_SECS", 120)?),
        min_score,
        production,
    })
}

impl Config {
    pub fn from_env() -> anyhow::Result<Self> {
        let mode = var("ENGRAM_MODE").unwrap_or_else(|| "development".into());
        let production = match mode.as_str() {
            "production" => true,
            "development" => false,
            other => bail!("ENGRAM_MODE must be `development` or `production`, not {other:?}"),
        };
        let jwt_secret = match var("ENGRAM_JWT_SECRET") {
            Some(s) if s.len() >= 32 => s.into_bytes(),
            Some(_) if production => bail!("ENGRAM_JWT_SECRET is shorter than 32 bytes: set a long random secret (e.g. `openssl rand -hex 32`) for production mode"),
            None if production => bail!("ENGRAM_JWT_SECRET is not set: production mode needs a random secret of at least 32 bytes (e.g. `openssl rand -hex 32`)"),
            Some(s) => s.into_bytes(),
            None => b"engram-development-secret-not-for-production".to_vec(),
        };
        let bind: SocketAddr = parse("ENGRAM_BIND", "127.0.0.1:3000".parse()?)?;
        let llm = match (
            var("ENGRAM_LLM_BASE_URL"),
            var("ENGRAM_LLM_API_KEY"),
            var("ENGRAM_LLM_MODEL"),
        ) {
            (Some(base_url), api_key, model) => Some(LlmSettings {
                base_url,
                api_key: api_key.unwrap_or_default(),
                model: model.unwrap_or_else(|| "gpt-4o-mini".into()),
            }),
            _ => None,
        };
        let proxy = proxy_settings(production, &jwt_secret)?;
        let settings = Settings {
            production,
            jwt_secret,
            jwt_ttl_secs: parse("ENGRAM_JWT_TTL_SECS", 24 * 3600)?,
            public_url: var("ENGRAM_PUBLIC_URL").unwrap_or_else(|| format!("http://{bind}")),
            limits: LimitSettings {
                login_per_minute: parse("ENGRAM_RATE_LOGIN_PER_MIN", 10)?,
                register_per_hour: parse("ENGRAM_RATE_REGISTER_PER_HOUR", 30)?,
                auto_register_per_hour: parse("ENGRAM_RATE_AUTO_REGISTER_PER_HOUR", 30)?,
                api_per_minute: parse("ENGRAM_RATE_API_PER_MIN", 600)?,
                models_per_minute: parse("ENGRAM_RATE_MODELS_PER_MIN", 300)?,
                claims: {
                    let d = ClaimLimits::default();
                    ClaimLimits {
                        init_per_machine_per_hour: parse(
                            "ENGRAM_CLAIM_INIT_PER_MACHINE_PER_HOUR",
                            d.init_per_machine_per_hour,
                        )?,
                        init_per_email_per_hour: parse(
                            "ENGRAM_CLAIM_INIT_PER_EMAIL_PER_HOUR",
                            d.init_per_email_per_hour,
                        )?,
                        wrong_per_machine_per_day: parse(
                            "ENGRAM_CLAIM_WRONG_PER_MACHINE_PER_DAY",
                            d.wrong_per_machine_per_day,
                        )?,
                        wrong_per_email_per_day: parse(
                            "ENGRAM_CLAIM_WRONG_PER_EMAIL_PER_DAY",
                            d.wrong_per_email_per_day,
                        )?,
                    }
                },
            },
            smtp_url: var("ENGRAM_SMTP_URL"),
            mail_from: var("ENGRAM_MAIL_FROM")
                .unwrap_or_else(|| "Engram <noreply@engram.local>".into()),
            llm,
            claim_ttl_secs: 15 * 60,
            trusted_proxies: app::core::clientaddr::TrustedProxies::parse(
                &var("ENGRAM_TRUSTED_PROXIES").unwrap_or_default(),
            )
            .map_err(|e| anyhow::anyhow!("ENGRAM_TRUSTED_PROXIES: {e}"))?,
            proxy,
            billing: BillingSettings {
                default_plan: var("ENGRAM_DEFAULT_PLAN").unwrap_or_else(|| "unlimited".into()),
                webhook_secret: var("ENGRAM_BILLING_WEBHOOK_SECRET"),
                checkout_url: var("ENGRAM_BILLING_CHECKOUT_URL"),
                contact: var("ENGRAM_BILLING_CONTACT"),
            },
            key_cache: match var("ENGRAM_KEY_CACHE").as_deref() {
                None | Some("on") => true,
                Some("off") => false,
                Some(other) => bail!("ENGRAM_KEY_CACHE must be `on` or `off`, not {other:?}"),
            },
        };
        Ok(Self {
            database_url: var("DATABASE_URL")
                .unwrap_or_else(|| "postgres://engram:engram@127.0.0.1:5432/engram".into()),
            bind,
            model_dir: var("ENGRAM_MODEL_DIR")
                .map(PathBuf::from)
                .unwrap_or_else(|| "models/all-MiniLM-L6-v2".into()),
            model_catalog: var("ENGRAM_MODEL_CATALOG")
                .map(PathBuf::from)
                .unwrap_or_else(|| crate::DEFAULT_MODEL_CATALOG.into()),
            site_root: var("ENGRAM_SITE_ROOT")
                .map(PathBuf::from)
                .unwrap_or_else(|| "target/site".into()),
            worker_concurrency: parse(
                "ENGRAM_WORKER_CONCURRENCY",
                2 * app::core::embed::MAX_BATCH,
            )?,
            failpoint_ingest_delay_ms: if production {
                0
            } else {
                parse("ENGRAM_FAILPOINT_INGEST_DELAY_MS", 0)?
            },
            heartbeat_secs: parse("ENGRAM_WORKER_HEARTBEAT_SECS", 10)?,
            query_cache: parse("ENGRAM_QUERY_CACHE", app::core::embed::QUERY_CACHE)?,
            metrics_bind: match var("ENGRAM_METRICS_BIND").as_deref() {
                Some("off") => None,
                Some(v) => Some(v.parse().map_err(|e| {
                    anyhow::anyhow!("ENGRAM_METRICS_BIND={v:?} is not an address: {e}")
                })?),
                None => Some("127.0.0.1:9464".parse()?),
            },
            settings,
        })
        .and_then(|c: Config| {
            if c.worker_concurrency == 0 {
                bail!("ENGRAM_WORKER_CONCURRENCY must be at least 1");
            }
            Ok(c)
        })
        .context("reading configuration")
    }
}
