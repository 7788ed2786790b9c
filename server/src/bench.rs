//! Benchmark commands: each builds a fresh bench database, runs the real server (router, worker,
//! model) in this process, and prints the figures it measured on this machine.
//!
//! - `bench classifier`: held-out accuracy of the local classifier;
//! - `bench ingest`: POST → completed throughput, acknowledgement and idle latencies, against the
//!   embedder's own batched rate;
//! - `bench locomo --data FILE`: turn-level retrieval recall on LoCoMo;
//! - `bench search`: search latency over HTTP at 10,000 and 100,000 memories in one account;
//! - `bench models`: public model-catalogue search latency over HTTP (the real litellm list);
//! - `bench proxy`: the LLM proxy's added time over the stand-in upstream called directly;
//! - `bench load`: 256 clients, 70 % searches and 30 % writes, against one `engram serve`
//!   process and then two on one database (these run as child processes).
use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Subcommand;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};
use sqlx::{Connection, PgConnection, PgPool};

use crate::config::Config;
use app::core::embed::EmbedderHandle;
use app::core::ingest::IngestOptions;
use app::core::search::{self, Weights};
use app::core::state::AppState;

#[derive(Subcommand, Debug)]
pub enum Bench {
    /// The sector classifier: cross-validation on the training rows (the variants it was chosen
    /// from), then the shipped head on the 200 held-out implicit memories, against the
    /// nearest-centroid classifier it replaced.
    Classifier {
        /// Also list the training rows cross-validation gets wrong.
        #[arg(long)]
        errors: bool,
    },
    /// Importance against people's ratings: Spearman's rho on the rated set, dev and held-out
    /// halves, and the mean score per rating and kind (short-but-vital, long-but-idle, plain).
    Importance,
    /// The embedder alone: one short query at a time (latency) and batches (throughput).
    Embed {
        /// LoCoMo file whose questions are the short queries.
        #[arg(long, default_value = "../shared/data/locomo/locomo_dev5.json")]
        data: PathBuf,
    },
    /// Ingestion: throughput, acknowledgement latency, idle end-to-end latency.
    Ingest {
        /// Batch sizes to ingest.
        #[arg(long, value_delimiter = ',', default_value = "1000,10000")]
        counts: Vec<usize>,
        /// Concurrent HTTP clients posting memories.
        #[arg(long, default_value_t = 64)]
        clients: usize,
        /// The paced round: the clients together post this many memories per second (each
        /// waits for its answer, then for its next turn), instead of as fast as they are
        /// answered.
        #[arg(long, default_value_t = 1000.0)]
        paced_rate: f64,
        /// Real text: the rounds post these LoCoMo turns in order (cycled), and the embedder's
        /// own rate is measured on them, instead of synthetic ~100-character texts.
        #[arg(long)]
        locomo: Option<PathBuf>,
    },
    /// Retrieval quality on LoCoMo conversations.
    Locomo {
        #[arg(long, default_value = "../shared/data/locomo/locomo_dev5.json")]
        data: PathBuf,
        /// Reuse the memories of the previous run (the bench database) instead of ingesting again.
        #[arg(long)]
        reuse: bool,
        /// Also print recall@10 for a grid of fusion weights.
        #[arg(long)]
        sweep: bool,
    },
    /// Model-catalogue search latency over HTTP: mixed queries, filters, sorts and pages.
    Models {
        /// Searches measured.
        #[arg(long, default_value_t = 1000)]
        queries: usize,
    },
    /// The LLM proxy's overhead: a call through Engram (memories searched and injected, the
    /// exchange remembered), then the body Engram sent upstream sent to the stand-in directly.
    Proxy {
        /// Memories in the account (real LoCoMo turns).
        #[arg(long, default_value_t = 10000)]
        memories: usize,
        /// Requests measured per kind.
        #[arg(long, default_value_t = 200)]
        requests: usize,
        #[arg(long, default_value = "../shared/data/locomo/locomo_dev5.json")]
        data: PathBuf,
    },
    /// Search latency over HTTP at several account sizes.
    Search {
        #[arg(long, value_delimiter = ',', default_value = "10000,100000")]
        sizes: Vec<usize>,
        /// Queries measured per size.
        #[arg(long, default_value_t = 300)]
        queries: usize,
        /// LoCoMo file whose turns and questions make the corpus and the queries.
        #[arg(long, default_value = "../shared/data/locomo/locomo_dev5.json")]
        data: PathBuf,
    },
    /// Mixed load against real `engram serve` processes (one, then two on one database):
    /// throughput, p50/p99 per kind, errors and each process's RSS.
    Load {
        /// Concurrent clients, each sending its next request when the last is answered.
        #[arg(long, default_value_t = 256)]
        clients: usize,
        /// Length of each round.
        #[arg(long, default_value_t = 60)]
        seconds: u64,
        /// Share of searches (the rest are new memories).
        #[arg(long, default_value_t = 0.7)]
        search_share: f64,
        /// Accounts the clients are spread over.
        #[arg(long, default_value_t = 8)]
        accounts: usize,
        /// Memories in the accounts together before the rounds (real LoCoMo turns).
        #[arg(long, default_value_t = 40_000)]
        memories: usize,
        /// The rounds: this many processes each.
        #[arg(long, value_delimiter = ',', default_value = "1,2")]
        processes: Vec<usize>,
        #[arg(long, default_value = "../shared/data/locomo/locomo_dev5.json")]
        data: PathBuf,
    },
    /// Statistics over HTTP on a large account: `GET /api/stats/usage?days=365` and
    /// `GET /api/stats`.
    Stats {
        /// Memories in the account (real LoCoMo turns, numbered so each is distinct).
        #[arg(long, default_value_t = 1_000_000)]
        memories: usize,
        /// Requests measured per route.
        #[arg(long, default_value_t = 300)]
        requests: usize,
        #[arg(long, default_value = "../shared/data/locomo/locomo_dev5.json")]
        data: PathBuf,
    },
}

pub async fn run(config: Config, which: Bench) -> anyhow::Result<()> {
    match which {
        Bench::Classifier { errors } => {
            classifier(&config, errors).await?;
            Ok(())
        }
        Bench::Importance => {
            importance_rank();
            Ok(())
        }
        Bench::Embed { data } => embed(config, &data).await,
        Bench::Ingest {
            counts,
            clients,
            paced_rate,
            locomo,
        } => ingest(config, &counts, clients, paced_rate, locomo.as_ref()).await,
        Bench::Locomo { data, reuse, sweep } => locomo(config, &data, reuse, sweep).await,
        Bench::Search {
            sizes,
            queries,
            data,
        } => search_latency(config, &sizes, queries, &data).await,
        Bench::Models { queries } => model_search(config, queries).await,
        Bench::Proxy {
            memories,
            requests,
            data,
        } => proxy_overhead(config, memories, requests, &data).await,
        Bench::Stats {
            memories,
            requests,
            data,
        } => stats_latency(config, memories, requests, &data).await,
        Bench::Load {
            clients,
            seconds,
            search_share,
            accounts,
            memories,
            processes,
            data,
        } => {
            load(
                config,
                clients,
                seconds,
                search_share,
                accounts,
                memories,
                &processes,
                &data,
            )
            .await
        }
    }
}

/// An account of `memories` memories (10 projects, every sector, created over the last year,
/// a year of daily usage with search and task histograms), then the statistics routes timed over
/// HTTP. The memories are inserted in bulk (no queue), without the HNSW index, which statistics
/// never read and which would take hours to build at this size on 2 cores; every other index and
/// the roll-up triggers are in place.
async fn stats_latency(
    config: Config,
    memories: usize,
    requests: usize,
    data: &PathBuf,
) -> anyhow::Result<()> {
    let turns: Vec<String> = load_locomo(data)?
        .iter()
        .flat_map(|c| c.turns.iter().map(|t| t.1.clone()))
        .collect();
    let mean = turns.iter().map(|t| t.len()).sum::<usize>() as f64 / turns.len().max(1) as f64;
    let h = harness(&config, false).await?;
    let (user, key) = h.account("stats@bench.local").await?;
    let pool: &PgPool = &h.state.pool;
    for i in 1..10 {
        app::core::projects::create(pool, user, &format!("project-{i}"), None)
            .await
            .map_err(|e| anyhow::anyhow!("{e}"))?;
    }
    let projects: Vec<String> =
        sqlx::query_scalar("select id from projects where user_id = $1 order by id")
            .bind(user)
            .fetch_all(pool)
            .await?;
    sqlx::query("drop index memories_embedding_idx")
        .execute(pool)
        .await?;
    let started = Instant::now();
    let chunk = 50_000usize;
    let mut done = 0usize;
    while done < memories {
        let n = chunk.min(memories - done);
        sqlx::query(
            "insert into memories (id, user_id, project_id, content, metadata, cognitive_sector,
                 importance_score, embedding, embedding_model, created_at)
             select gen_random_uuid(), $1, ($2::text[])[1 + (g % array_length($2::text[], 1))],
                 ($3::text[])[1 + (g % array_length($3::text[], 1))] || ' #' || g,
                 jsonb_build_object('n', g),
                 (array['episodic','semantic','procedural','emotional','reflective'])[1 + (g * 7 % 5)],
                 0.5, array_fill(0.05::real, array[384])::vector, 'all-MiniLM-L6-v2',
                 now() - (g % 365) * interval '1 day'
             from generate_series($4::bigint, $5::bigint) g",
        )
        .bind(user)
        .bind(&projects)
        .bind(&turns)
        .bind(done as i64)
        .bind((done + n - 1) as i64)
        .execute(pool)
        .await?;
        done += n;
        eprint!(
            "\r# {done} memories inserted ({:.0} s)",
            started.elapsed().as_secs_f64()
        );
    }
    eprintln!();
    // A year of API calls, searches and tasks with their latency histograms.
    sqlx::query(
        "update usage_daily set api_calls = 5000 + (extract(doy from day)::int * 37 % 3000),
             searches = 800 + (extract(doy from day)::int * 13 % 400),
             search_ms = hist_of(array(select hist_bucket(12 + (g % 40)) from generate_series(1, 200) g)),
             tasks_completed = memories_created, task_ms = hist_of(array(select hist_bucket(30 + (g % 300)) from generate_series(1, 200) g)),
             proxy_requests = 40, proxy_tokens_in = 52000, proxy_tokens_out = 9000
         where user_id = $1",
    )
    .bind(user)
    .execute(pool)
    .await?;
    let mut conn = PgConnection::connect(&replace_db(&config.database_url, "engram_bench")).await?;
    let note = settle(&mut conn).await?;
    let (rows, days): (i64, i64) = sqlx::query_as(
        "select (select count(*) from memories where user_id = $1), (select count(*) from usage_daily where user_id = $1)",
    )
    .bind(user)
    .fetch_one(pool)
    .await?;
    println!(
        "account: {rows} memories (LoCoMo turns, mean {mean:.0} characters) in 10 projects, {days} days of usage; loaded in {:.0} s{note}",
        started.elapsed().as_secs_f64()
    );
    for path in ["/api/stats/usage?days=365", "/api/stats"] {
        for _ in 0..20 {
            h.http
                .get(format!("{}{path}", h.base))
                .header("x-api-key", &key)
                .send()
                .await?
                .error_for_status()?;
        }
        let mut ms = Vec::with_capacity(requests);
        let mut last = Value::Null;
        for _ in 0..requests {
            let t = Instant::now();
            let r = h
                .http
                .get(format!("{}{path}", h.base))
                .header("x-api-key", &key)
                .send()
                .await?;
            let status = r.status();
            let bytes = r.bytes().await?;
            ms.push(t.elapsed().as_secs_f64() * 1000.0);
            anyhow::ensure!(status.is_success(), "{path}: {status}");
            last = serde_json::from_slice(&bytes)?;
        }
        let ms = sorted(ms);
        println!(
            "GET {path}: {requests} requests, one client, p50 {:.2} ms, p95 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
            percentile(&ms, 50.0),
            percentile(&ms, 95.0),
            percentile(&ms, 99.0),
            ms.last().copied().unwrap_or(f64::NAN)
        );
        if path == "/api/stats" {
            anyhow::ensure!(
                last["total_memories"] == rows,
                "total_memories {} != {rows}",
                last["total_memories"]
            );
            println!(
                "  total_memories {} (counted rows {rows}), storage {}",
                last["total_memories"], last["storage_used"]
            );
        } else {
            anyhow::ensure!(
                last["daily"].as_array().map(Vec::len) == Some(365),
                "365 days"
            );
        }
    }
    Ok(())
}

/// One chat completion: (time to the first body byte, total), in ms.
async fn timed_chat(
    http: &reqwest::Client,
    url: &str,
    key: Option<&str>,
    body: &Value,
) -> anyhow::Result<(f64, f64)> {
    let t = Instant::now();
    let mut req = http.post(url).json(body);
    if let Some(k) = key {
        req = req.bearer_auth(k).header("x-engram-remember", "on");
    }
    let mut r = req.send().await?;
    anyhow::ensure!(r.status().is_success(), "{url}: {}", r.status());
    let mut first = None;
    while let Some(chunk) = r.chunk().await? {
        if first.is_none() && !chunk.is_empty() {
            first = Some(t.elapsed().as_secs_f64() * 1e3);
        }
    }
    let total = t.elapsed().as_secs_f64() * 1e3;
    Ok((first.unwrap_or(total), total))
}

async fn proxy_overhead(
    config: Config,
    memories: usize,
    requests: usize,
    data: &PathBuf,
) -> anyhow::Result<()> {
    let conversations = load_locomo(data)?;
    let h = harness(&config, false).await?;
    let (user, key) = h.account("proxy@bench.local").await?;
    let (turns, questions) = turns_and_questions(&conversations);
    let corpus: Vec<String> = turns.iter().cycle().take(memories).cloned().collect();
    let vectors = h.state.embedder.embed_many(&turns).await?;
    for (chunk_i, chunk) in corpus.chunks(2000).enumerate() {
        let chunk_vectors: Vec<&[f32]> = (0..chunk.len())
            .map(|i| vectors[(chunk_i * 2000 + i) % turns.len()].as_slice())
            .collect();
        insert_memories(&h.state.pool, user, chunk, &chunk_vectors).await?;
    }
    {
        let mut conn = h.state.pool.acquire().await?;
        println!(
            "# bench proxy: {memories} memories (real LoCoMo turns){}",
            settle(&mut conn).await?
        );
    }
    let (upstream, recorder) = crate::standin::spawn(crate::standin::Options {
        delay_ms: 2,
        ..Default::default()
    })
    .await;
    h.post_put_settings(
        &key,
        &json!({"base_url": upstream, "api_key": "sk-bench", "model": "standin-small"}),
    )
    .await?;
    let direct_url = format!("{upstream}/chat/completions");
    let proxy_url = format!("{}/api/v1/chat/completions", h.base);
    for stream in [false, true] {
        let body = |q: &str| {
            json!({"model": "standin-small", "stream": stream, "messages": [
            {"role": "system", "content": "You are a helpful assistant with a long memory."},
            {"role": "user", "content": q}]})
        };
        // Warm-up: connections, prepared statements, the catalogue.
        for q in questions.iter().take(30) {
            timed_chat(&h.http, &direct_url, None, &body(q)).await?;
            timed_chat(&h.http, &proxy_url, Some(&key), &body(q)).await?;
            h.post(
                &key,
                "/api/v1/memories/search",
                &json!({"query": q, "limit": 10}),
            )
            .await?;
        }
        let (mut d_first, mut d_total, mut p_first, mut p_total, mut search) =
            (vec![], vec![], vec![], vec![], vec![]);
        for q in questions.iter().cycle().skip(30).take(requests) {
            let (f, t) = timed_chat(&h.http, &proxy_url, Some(&key), &body(q)).await?;
            p_first.push(f);
            p_total.push(t);
            // Direct: the very body Engram sent upstream (memories included), so both answers
            // are the same length (the stand-in's reply echoes the injected memories).
            let sent = recorder
                .last()
                .map(|r| r["body"].clone())
                .ok_or_else(|| anyhow::anyhow!("the stand-in received nothing"))?;
            let (f, t) = timed_chat(&h.http, &direct_url, None, &sent).await?;
            d_first.push(f);
            d_total.push(t);
            let t = Instant::now();
            h.post(
                &key,
                "/api/v1/memories/search",
                &json!({"query": q, "limit": 10}),
            )
            .await?;
            search.push(t.elapsed().as_secs_f64() * 1e3);
        }
        let (d_first, d_total, p_first, p_total, search) = (
            sorted(d_first),
            sorted(d_total),
            sorted(p_first),
            sorted(p_total),
            sorted(search),
        );
        let row = |name: &str, v: &[f64]| {
            format!(
                "{name} p50 {:.2} ms, p95 {:.2} ms",
                percentile(v, 50.0),
                percentile(v, 95.0)
            )
        };
        println!(
            "\n{} ({requests} requests, one client):",
            if stream { "streaming" } else { "not streaming" }
        );
        println!(
            "  direct to the stand-in: {}; {}",
            row("first byte", &d_first),
            row("total", &d_total)
        );
        println!(
            "  through Engram:         {}; {}",
            row("first byte", &p_first),
            row("total", &p_total)
        );
        println!(
            "  added at p50: first byte {:.2} ms, total {:.2} ms; a search alone (HTTP): {}",
            percentile(&p_first, 50.0) - percentile(&d_first, 50.0),
            percentile(&p_total, 50.0) - percentile(&d_total, 50.0),
            row("", &search).trim_start()
        );
    }
    Ok(())
}

/// The mix of catalogue searches a person or an agent sends: names, typos, families with sizes,
/// the filters alone and together, each sort, later pages.
const MODEL_QUERIES: [&str; 24] = [
    "q=claude+sonnet",
    "q=gpt-4o",
    "q=llama+70b",
    "q=cluade+sonet",
    "q=gemini+flash",
    "q=gpt4o+mini",
    "q=mistral+large&sort=price",
    "q=deepseek",
    "q=qwen+coder&limit=50",
    "q=embedding+small&mode=embedding",
    "q=whisper",
    "q=antrhopic+haiku",
    "provider=anthropic",
    "provider=openai&mode=chat&sort=price",
    "mode=embedding&sort=price&limit=100",
    "min_context=200000&capability=tools&max_input_price=1&mode=chat",
    "capability=tools&capability=vision&sort=context",
    "capability=caching,reasoning&sort=price",
    "max_input_price=0.5&max_output_price=1&mode=chat",
    "sort=context&limit=100",
    "q=gpt&offset=40",
    "q=claude&provider=bedrock&sort=price",
    "min_context=1000000",
    "",
];

async fn model_search(config: Config, queries: usize) -> anyhow::Result<()> {
    let h = harness(&config, false).await?;
    let bytes = std::fs::read(&config.model_catalog).map_err(|e| {
        anyhow::anyhow!("{}: {e} (run `make setup`)", config.model_catalog.display())
    })?;
    let started = Instant::now();
    let report = app::core::models::import(&h.state.pool, &bytes)
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    println!(
        "import: {} in {:.2} s",
        crate::describe_import(&config.model_catalog, &report),
        started.elapsed().as_secs_f64()
    );
    // Warm: the first search loads the catalogue into the process.
    for q in MODEL_QUERIES {
        h.http
            .get(format!("{}/api/v1/models/search?{q}", h.base))
            .send()
            .await?
            .error_for_status()?;
    }
    let mut rng = StdRng::seed_from_u64(19);
    let mut http_ms = Vec::with_capacity(queries);
    let mut local_ms = Vec::with_capacity(queries);
    let catalog = h.state.models.get(&h.state.pool).await?;
    for _ in 0..queries {
        let q = MODEL_QUERIES[rng.random_range(0..MODEL_QUERIES.len())];
        let t = Instant::now();
        let r = h
            .http
            .get(format!("{}/api/v1/models/search?{q}", h.base))
            .send()
            .await?;
        let status = r.status();
        let _ = r.bytes().await?;
        http_ms.push(t.elapsed().as_secs_f64() * 1000.0);
        anyhow::ensure!(status.is_success(), "{q}: {status}");
        let query = <app::core::models::ModelQuery as app::core::validate::FromFields>::read(
            app::core::validate::Fields::from_query(Some(q)),
        )
        .map_err(|e| anyhow::anyhow!("{e}"))?;
        let t = Instant::now();
        std::hint::black_box(app::core::models::search(&catalog, &query).total);
        local_ms.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    let (http_ms, local_ms) = (sorted(http_ms), sorted(local_ms));
    println!(
        "{queries} mixed catalogue searches over {} models, one client, HTTP: p50 {:.2} ms, p95 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
        catalog.len(),
        percentile(&http_ms, 50.0),
        percentile(&http_ms, 95.0),
        percentile(&http_ms, 99.0),
        http_ms.last().copied().unwrap_or(f64::NAN)
    );
    println!(
        "  of which the search itself (in process): p50 {:.3} ms, p95 {:.3} ms",
        percentile(&local_ms, 50.0),
        percentile(&local_ms, 95.0)
    );
    Ok(())
}

/// A running server on a fresh bench database.
struct Harness {
    base: String,
    state: AppState,
    http: reqwest::Client,
    /// The ingest bench's clients (see [`Poster`]).
    posters: tokio::sync::Mutex<Vec<Poster>>,
}

async fn harness(config: &Config, with_worker: bool) -> anyhow::Result<Harness> {
    harness_on(config, with_worker, true).await
}

async fn harness_on(config: &Config, with_worker: bool, fresh: bool) -> anyhow::Result<Harness> {
    let admin = replace_db(&config.database_url, "postgres");
    let mut conn = PgConnection::connect(&admin).await?;
    if fresh {
        sqlx::query("drop database if exists engram_bench with (force)")
            .execute(&mut conn)
            .await?;
        sqlx::query("create database engram_bench")
            .execute(&mut conn)
            .await?;
    }
    let url = replace_db(&config.database_url, "engram_bench");
    let pool = crate::pool_options()
        .max_connections(40)
        .connect_with(crate::connect_options(&url)?)
        .await?;
    crate::migrate(&pool).await?;
    let mut settings = config.settings.clone();
    settings.limits.api_per_minute = u32::MAX;
    settings.limits.register_per_hour = u32::MAX;
    settings.limits.models_per_minute = u32::MAX;
    let state = crate::build_state(
        pool.clone(),
        settings,
        EmbedderHandle::new(&config.model_dir),
        &config.site_root.to_string_lossy(),
    );
    // The benches time the model: no query is answered from the recent queries' cache (the
    // search bench measures it in a round of its own).
    state.embedder.set_query_cache(0);
    // As `engram serve` runs it: the daily counts written and the quota figures read again
    // every 2 seconds; the housekeeping loop (among others, `memories` analyzed again once
    // enough of it changed).
    crate::spawn_quota_refresh(state.clone());
    crate::spawn_housekeeping(state.clone(), Duration::from_secs(5));
    let ctx = crate::ingest_context(&state, IngestOptions::default());
    ctx.warm_up().await?;
    if with_worker {
        let concurrency = config.worker_concurrency;
        tokio::spawn(async move {
            if let Err(e) = crate::worker::run(
                pool,
                ctx,
                concurrency,
                Duration::from_secs(10),
                std::future::pending(),
            )
            .await
            {
                eprintln!("worker stopped: {e:#}");
            }
        });
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let base = format!("http://{}", listener.local_addr()?);
    let router = crate::router(state.clone());
    tokio::spawn(async move {
        axum::serve(
            listener,
            router.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
    });
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(256)
        .build()?;
    Ok(Harness {
        base,
        state,
        http,
        posters: Default::default(),
    })
}

fn replace_db(url: &str, db: &str) -> String {
    let (base, rest) = url.rsplit_once('/').unwrap_or((url, ""));
    let query = rest
        .split_once('?')
        .map(|(_, q)| format!("?{q}"))
        .unwrap_or_default();
    format!("{base}/{db}{query}")
}

impl Harness {
    /// A new account with an API key: (user id, key).
    async fn account(&self, email: &str) -> anyhow::Result<(i64, String)> {
        let user = app::core::accounts::register(&self.state.pool, email, "bench-password")
            .await
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        let key = app::core::keys::create(&self.state.pool, user.id, None, "bench")
            .await
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        Ok((user.id, key.key))
    }

    async fn post_put_settings(&self, key: &str, body: &Value) -> anyhow::Result<()> {
        let r = self
            .http
            .put(format!("{}/api/v1/proxy/settings", self.base))
            .header("x-api-key", key)
            .json(body)
            .send()
            .await?;
        anyhow::ensure!(r.status().is_success(), "proxy settings: {}", r.status());
        Ok(())
    }

    async fn post(&self, key: &str, path: &str, body: &Value) -> anyhow::Result<Value> {
        let r = self
            .http
            .post(format!("{}{path}", self.base))
            .header("x-api-key", key)
            .json(body)
            .send()
            .await?;
        let status = r.status();
        let v: Value = r.json().await?;
        anyhow::ensure!(status.is_success(), "{path}: {status} {v}");
        Ok(v)
    }

    async fn completed(&self, user_id: i64) -> anyhow::Result<(i64, i64)> {
        Ok(sqlx::query_as("select count(*) filter (where status = 'completed'), count(*) filter (where status = 'failed') from tasks where user_id = $1")
            .bind(user_id)
            .fetch_one(&self.state.pool)
            .await?)
    }

    /// Waits until the account's `n` tasks are completed; answers how long after `since` (a
    /// database clock reading) the last one completed. Polls only every 250 ms, since each poll
    /// counts the account's tasks on the same cores as the pipeline measured; the time comes from
    /// the tasks' own `completed_at`, so the polling interval does not blur it.
    async fn wait_all(&self, user_id: i64, n: usize, since: DbInstant) -> anyhow::Result<f64> {
        loop {
            let (done, failed) = self.completed(user_id).await?;
            anyhow::ensure!(failed == 0, "{failed} tasks failed");
            if done as usize >= n {
                break;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        Ok(sqlx::query_scalar(
            "select extract(epoch from max(completed_at) - $2)::float8 from tasks where user_id = $1",
        )
        .bind(user_id)
        .bind(since.0)
        .fetch_one(&self.state.pool)
        .await?)
    }

    /// The database's clock now.
    async fn db_now(&self) -> anyhow::Result<DbInstant> {
        Ok(DbInstant(
            sqlx::query_scalar("select clock_timestamp()")
                .fetch_one(&self.state.pool)
                .await?,
        ))
    }
}

/// The model thread's counters at one moment.
struct EmbedSnapshot {
    batches: u64,
    texts: u64,
    busy_ns: u64,
    yielded_ns: u64,
}

impl EmbedSnapshot {
    fn take(embedder: &EmbedderHandle) -> Self {
        let s = embedder.stats(app::core::embed::Lane::Bulk);
        Self {
            batches: s.batches.load(Ordering::Relaxed),
            texts: s.texts.load(Ordering::Relaxed),
            busy_ns: s.busy_ns.load(Ordering::Relaxed),
            yielded_ns: s.yielded_ns.load(Ordering::Relaxed),
        }
    }

    /// How busy the model was since `before`, over `elapsed` seconds.
    fn since(&self, before: &Self, elapsed: f64) -> String {
        let batches = (self.batches - before.batches).max(1);
        let busy = (self.busy_ns - before.busy_ns) as f64 / 1e9;
        format!(
            "model busy {:.0} % of the run; {} forward passes, {:.1} texts each on average; paused {:.2} s for the API's writes",
            100.0 * busy / elapsed,
            batches,
            (self.texts - before.texts) as f64 / batches as f64,
            (self.yielded_ns - before.yielded_ns) as f64 / 1e9
        )
    }
}

/// A reading of the database's clock (task timestamps are on it).
#[derive(Clone, Copy)]
struct DbInstant(chrono::DateTime<chrono::Utc>);

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let idx = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    sorted[idx.min(sorted.len() - 1)]
}

fn sorted(mut v: Vec<f64>) -> Vec<f64> {
    v.sort_by(|a, b| a.total_cmp(b));
    v
}

/// Varied memory-like sentences (12 to 30 words), deterministic.
fn synthetic_texts(n: usize, seed: u64) -> Vec<String> {
    const NAMES: [&str; 12] = [
        "Maria", "Sam", "Priya", "Jonas", "Aiko", "Liam", "Fatima", "Chen", "Olga", "Diego",
        "Nora", "Kwame",
    ];
    const PLACES: [&str; 10] = [
        "Lisbon",
        "the office",
        "the gym",
        "Osaka",
        "the cabin",
        "Berlin",
        "the clinic",
        "the market",
        "Nairobi",
        "the lake",
    ];
    const TEMPLATES: [&str; 8] = [
        "Yesterday {n} and I went to {p} and talked for {k} minutes about the new project plan and the deadline.",
        "{n} prefers oat milk in coffee and hates loud music while working at {p}.",
        "To restart the ingestion service, run make deploy, wait {k} seconds, then check the dashboard at {p}.",
        "{n} is allergic to peanuts and carries an EpiPen everywhere, including {p}.",
        "Looking back, moving the team meeting to {p} on Fridays made everyone calmer and more focused.",
        "The invoice number {k} for {n} was paid late because the bank in {p} was closed.",
        "I felt nervous before presenting to {n}'s board at {p}, but it went well after {k} minutes.",
        "Remember that {n} wants the quarterly report by the {k}th and reviews it at {p}.",
    ];
    let mut rng = StdRng::seed_from_u64(seed);
    (0..n)
        .map(|i| {
            let t = TEMPLATES[rng.random_range(0..TEMPLATES.len())];
            let s = t
                .replace("{n}", NAMES[rng.random_range(0..NAMES.len())])
                .replace("{p}", PLACES[rng.random_range(0..PLACES.len())])
                .replace("{k}", &rng.random_range(2..99).to_string());
            format!("{s} (note {i})")
        })
        .collect()
}

/// One benchmark client: an HTTP/1.1 keep-alive connection of its own.
///
/// The load generator shares the server's two cores, so it is kept lean: hyper's connection
/// directly, without reqwest's pool, URL parsing, proxy and redirect handling (in `perf`, the
/// reqwest clients took 29 % of the CPU while 64 of them posted, more than the HTTP server).
struct Poster {
    send: hyper::client::conn::http1::SendRequest<http_body_util::Full<bytes::Bytes>>,
    host: axum::http::HeaderValue,
}

impl Poster {
    async fn connect(base: &str) -> anyhow::Result<Self> {
        let addr = base.trim_start_matches("http://");
        let stream = tokio::net::TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        let (send, conn) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await?;
        tokio::spawn(conn);
        Ok(Self {
            send,
            host: axum::http::HeaderValue::from_str(addr)?,
        })
    }

    /// Posts one memory; the milliseconds until it was acknowledged.
    async fn post_memory(&mut self, key: &str, text: &str) -> anyhow::Result<f64> {
        let t = Instant::now();
        let body = serde_json::to_vec(&json!({"content": text}))?;
        let request = axum::http::Request::post("/api/v1/memories")
            .header(axum::http::header::HOST, self.host.clone())
            .header(axum::http::header::CONTENT_TYPE, "application/json")
            .header("x-api-key", key)
            .body(http_body_util::Full::new(bytes::Bytes::from(body)))?;
        self.send.ready().await?;
        let response = self.send.send_request(request).await?;
        let status = response.status();
        http_body_util::BodyExt::collect(response.into_body()).await?;
        anyhow::ensure!(status.is_success(), "POST {status}");
        Ok(t.elapsed().as_secs_f64() * 1e3)
    }
}

/// The clients' connections, opened once and kept across rounds.
async fn connect_clients(h: &Harness, clients: usize) -> anyhow::Result<()> {
    let mut posters = h.posters.lock().await;
    while posters.len() < clients {
        posters.push(Poster::connect(&h.base).await?);
    }
    Ok(())
}

/// `clients` clients post `texts` together, each its next text as soon as its last is answered;
/// the milliseconds each POST took to be acknowledged.
async fn post_all(
    h: &Harness,
    key: &str,
    texts: Arc<Vec<String>>,
    clients: usize,
) -> anyhow::Result<Vec<f64>> {
    connect_clients(h, clients).await?;
    let posters: Vec<Poster> = h.posters.lock().await.drain(..).collect();
    let next = Arc::new(AtomicUsize::new(0));
    let mut handles = vec![];
    for mut poster in posters {
        let (texts, next, key) = (texts.clone(), next.clone(), key.to_string());
        handles.push(tokio::spawn(async move {
            let mut latencies = vec![];
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= texts.len() {
                    return Ok::<_, anyhow::Error>((poster, latencies));
                }
                latencies.push(poster.post_memory(&key, &texts[i]).await?);
            }
        }));
    }
    let mut acks = vec![];
    for handle in handles {
        let (poster, latencies) = handle.await??;
        h.posters.lock().await.push(poster);
        acks.extend(latencies);
    }
    Ok(acks)
}

async fn ingest(
    config: Config,
    counts: &[usize],
    clients: usize,
    paced_rate: f64,
    locomo: Option<&PathBuf>,
) -> anyhow::Result<()> {
    let turns: Option<Vec<String>> = match locomo {
        Some(path) => Some(
            load_locomo(path)?
                .into_iter()
                .flat_map(|c| c.turns.into_iter().map(|t| t.1))
                .collect(),
        ),
        None => None,
    };
    // The texts of a round: real turns from a different place in the file each round, or
    // synthetic ones.
    let texts_for = |n: usize, seed: u64| -> Vec<String> {
        match &turns {
            Some(t) => t
                .iter()
                .cycle()
                .skip((seed as usize * 997) % t.len())
                .take(n)
                .cloned()
                .collect(),
            None => synthetic_texts(n, seed),
        }
    };
    let h = harness(&config, true).await?;
    println!("# bench ingest (2 cores; one process: HTTP + apalis worker + embedder; worker concurrency {})", config.worker_concurrency);

    // The embedder's own batched rate, measured in the same run before and after each round
    // (the machine's speed drifts by a few per cent between minutes); each round is compared with
    // the mean of the two measurements around it.
    let texts = texts_for(768, 1);
    if turns.is_some() {
        println!("(real text: LoCoMo turns)");
    }
    h.state.embedder.embed_many(&texts[..32]).await?;
    let embedder_rate = || async {
        let start = Instant::now();
        h.state.embedder.embed_many(&texts).await?;
        let rate = texts.len() as f64 / start.elapsed().as_secs_f64();
        println!(
            "embedder alone ({} texts in batches of up to {}): {rate:.1} texts/s",
            texts.len(),
            app::core::embed::MAX_BATCH,
        );
        anyhow::Ok(rate)
    };

    // A warm-up round, not measured: the 64 clients' connections, the pool's connections and
    // their prepared statements, the first pages of the new database's tables and the worker
    // all start cold, and in a round of 1,000 (a tenth of a second of POSTs) that start-up
    // would be a tenth of the samples.
    let (user, key) = h.account("warmup@bench.local").await?;
    let since = h.db_now().await?;
    post_all(&h, &key, Arc::new(texts_for(256, 99)), clients).await?;
    h.wait_all(user, 256, since).await?;

    let mut rate_before = embedder_rate().await?;
    for (round, &n) in counts.iter().enumerate() {
        let (user, key) = h.account(&format!("ingest{round}@bench.local")).await?;
        let texts = Arc::new(texts_for(n, 100 + round as u64));
        let before = EmbedSnapshot::take(&h.state.embedder);
        let since = h.db_now().await?;
        let start = Instant::now();
        let acks = post_all(&h, &key, texts, clients).await?;
        let posted = start.elapsed().as_secs_f64();
        let elapsed = h.wait_all(user, n, since).await?;
        let model = EmbedSnapshot::take(&h.state.embedder).since(&before, elapsed);
        let rate_after = embedder_rate().await?;
        let embed_rate = (rate_before + rate_after) / 2.0;
        rate_before = rate_after;
        let acks = sorted(acks);
        let rate = n as f64 / elapsed;
        println!(
            "ingest {n:>6} memories, {clients} clients: {rate:.1} memories/s end to end ({elapsed:.1} s; all POSTs answered in {posted:.1} s); \
             ack p50 {:.2} ms p95 {:.2} ms p99 {:.2} ms; ingestion / embedder ({embed_rate:.1} texts/s) = {:.0} %",
            percentile(&acks, 50.0),
            percentile(&acks, 95.0),
            percentile(&acks, 99.0),
            100.0 * rate / embed_rate
        );
        println!("  {model}");
    }

    // Paced: the same clients post at a fixed total rate, far above what the model ingests but
    // below what the HTTP path answers, so the acknowledgement is measured without the
    // closed loop's queueing (there, each answer releases the next request at once, and the
    // latency is the clients' number over the server's rate).
    let n = (3.0 * paced_rate).round() as usize;
    let (user, key) = h.account("paced@bench.local").await?;
    let texts = Arc::new(texts_for(n, 50));
    let before = EmbedSnapshot::take(&h.state.embedder);
    let since = h.db_now().await?;
    let every = Duration::from_secs_f64(clients as f64 / paced_rate);
    connect_clients(&h, clients).await?;
    let posters: Vec<Poster> = h.posters.lock().await.drain(..).collect();
    let mut handles = vec![];
    for (c, mut poster) in posters.into_iter().enumerate() {
        let (texts, key) = (texts.clone(), key.clone());
        handles.push(tokio::spawn(async move {
            // Turns staggered across the clients, so the total rate is even.
            tokio::time::sleep(every.mul_f64(c as f64 / clients as f64)).await;
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut latencies = vec![];
            for i in (c..texts.len()).step_by(clients) {
                tick.tick().await;
                latencies.push(poster.post_memory(&key, &texts[i]).await?);
            }
            Ok::<_, anyhow::Error>(latencies)
        }));
    }
    let start = Instant::now();
    let mut acks = vec![];
    for handle in handles {
        acks.extend(handle.await??);
    }
    let posted = start.elapsed().as_secs_f64();
    let paused = EmbedSnapshot::take(&h.state.embedder).yielded_ns - before.yielded_ns;
    h.wait_all(user, n, since).await?;
    let acks = sorted(acks);
    println!(
        "paced {n} memories, {clients} clients at {paced_rate:.0}/s together ({:.0}/s achieved, while the worker ingests): ack p50 {:.2} ms p95 {:.2} ms p99 {:.2} ms; the model paused {:.2} s for them",
        n as f64 / posted,
        percentile(&acks, 50.0),
        percentile(&acks, 95.0),
        percentile(&acks, 99.0),
        paused as f64 / 1e9
    );

    // Idle: one memory at a time, POST → completed as a client polling the task sees it.
    let (_, key) = h.account("idle@bench.local").await?;
    let texts = synthetic_texts(100, 7);
    let mut e2e = vec![];
    for text in &texts {
        let t = Instant::now();
        let v = h
            .post(&key, "/api/v1/memories", &json!({"content": text}))
            .await?;
        let task = v["task_id"].as_str().unwrap_or_default().to_string();
        loop {
            let r: Value = h
                .http
                .get(format!("{}/api/v1/tasks/{task}", h.base))
                .header("x-api-key", &key)
                .send()
                .await?
                .json()
                .await?;
            if r["data"]["status"] == "completed" {
                break;
            }
            anyhow::ensure!(r["data"]["status"] != "failed", "task failed: {r}");
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        e2e.push(t.elapsed().as_secs_f64() * 1e3);
    }
    let e2e = sorted(e2e);
    println!(
        "idle POST → completed ({} memories, one at a time, polling every 2 ms): p50 {:.1} ms, p95 {:.1} ms, max {:.1} ms",
        e2e.len(),
        percentile(&e2e, 50.0),
        percentile(&e2e, 95.0),
        e2e.last().copied().unwrap_or_default()
    );
    Ok(())
}

async fn embed(config: Config, data: &PathBuf) -> anyhow::Result<()> {
    let embedder = EmbedderHandle::new(&config.model_dir);
    embedder.set_query_cache(0);
    embedder.warm_up().await?;
    let questions: Vec<String> = load_locomo(data)?
        .into_iter()
        .flat_map(|c| c.questions.into_iter().map(|q| q.0))
        .take(300)
        .collect();
    let mut single = vec![];
    for q in &questions {
        let t = Instant::now();
        embedder.embed_query(q).await?;
        single.push(t.elapsed().as_secs_f64() * 1e3);
    }
    let single = sorted(single);
    println!(
        "one query at a time ({} LoCoMo questions): p50 {:.2} ms, p95 {:.2} ms",
        single.len(),
        percentile(&single, 50.0),
        percentile(&single, 95.0)
    );
    let texts = synthetic_texts(768, 1);
    let start = Instant::now();
    embedder.embed_many(&texts).await?;
    println!(
        "memory-like texts in batches of up to {}: {:.1} texts/s",
        app::core::embed::MAX_BATCH,
        texts.len() as f64 / start.elapsed().as_secs_f64()
    );
    // Real conversation turns as they arrive (LoCoMo, in order): lengths vary, so a batch
    // padded to its longest text wastes work unless it is split by length.
    let turns: Vec<String> = load_locomo(data)?
        .into_iter()
        .flat_map(|c| c.turns.into_iter().map(|t| t.1))
        .take(1536)
        .collect();
    let chars: usize = turns.iter().map(|t| t.chars().count()).sum();
    let start = Instant::now();
    embedder.embed_many(&turns).await?;
    println!(
        "{} LoCoMo turns (mean {} characters) in batches of up to {}: {:.1} texts/s",
        turns.len(),
        chars / turns.len().max(1),
        app::core::embed::MAX_BATCH,
        turns.len() as f64 / start.elapsed().as_secs_f64()
    );
    Ok(())
}

/// One LoCoMo conversation: its turns and its answerable questions.
struct Conversation {
    id: String,
    turns: Vec<(String, String, i64, String)>, // (dia_id, content, session, date)
    questions: Vec<(String, i64, Vec<String>)>, // (question, category, evidence)
}

/// Every turn's text and every question, in order.
fn turns_and_questions(conversations: &[Conversation]) -> (Vec<String>, Vec<String>) {
    (
        conversations
            .iter()
            .flat_map(|c| c.turns.iter().map(|t| t.1.clone()))
            .collect(),
        conversations
            .iter()
            .flat_map(|c| c.questions.iter().map(|q| q.0.clone()))
            .collect(),
    )
}

fn load_locomo(path: &PathBuf) -> anyhow::Result<Vec<Conversation>> {
    let raw: Value = serde_json::from_str(
        &std::fs::read_to_string(path)
            .map_err(|e| anyhow::anyhow!("reading {}: {e}", path.display()))?,
    )?;
    let mut out = vec![];
    for sample in raw
        .as_array()
        .ok_or_else(|| anyhow::anyhow!("LoCoMo file is not a list"))?
    {
        let conv = &sample["conversation"];
        let mut turns = vec![];
        for session in 1..100 {
            let Some(list) = conv
                .get(format!("session_{session}"))
                .and_then(|v| v.as_array())
            else {
                continue;
            };
            let date = conv
                .get(format!("session_{session}_date_time"))
                .and_then(|v| v.as_str())
                .unwrap_or_default()
                .to_string();
            for turn in list {
                let (Some(speaker), Some(text), Some(dia)) = (
                    turn["speaker"].as_str(),
                    turn["text"].as_str(),
                    turn["dia_id"].as_str(),
                ) else {
                    continue;
                };
                turns.push((
                    dia.trim().to_string(),
                    format!("{speaker}: {text}"),
                    session,
                    date.clone(),
                ));
            }
        }
        let known: HashSet<&str> = turns.iter().map(|t| t.0.as_str()).collect();
        let mut questions = vec![];
        for qa in sample["qa"].as_array().into_iter().flatten() {
            let category = qa["category"].as_i64().unwrap_or(0);
            if !(1..=4).contains(&category) {
                continue;
            }
            // Normalise evidence: split joined ids, trim, keep those that exist.
            let evidence: Vec<String> = qa["evidence"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|e| e.as_str())
                .flat_map(|e| {
                    e.split([',', ';', ' '])
                        .map(|s| s.trim().to_string())
                        .collect::<Vec<_>>()
                })
                .filter(|e| known.contains(e.as_str()))
                .collect::<HashSet<_>>()
                .into_iter()
                .collect();
            if evidence.is_empty() {
                continue;
            }
            let Some(question) = qa["question"].as_str() else {
                continue;
            };
            questions.push((question.to_string(), category, evidence));
        }
        out.push(Conversation {
            id: sample["sample_id"].as_str().unwrap_or("conv").to_string(),
            turns,
            questions,
        });
    }
    Ok(out)
}

#[derive(Default, Clone)]
struct Scores {
    n: usize,
    recall: [f64; 4], // @1, @5, @10, @20
    hit10: f64,
    all10: f64,
    mrr: f64,
}

impl Scores {
    fn add(&mut self, ranked: &[String], evidence: &[String]) {
        self.n += 1;
        let ev: HashSet<&String> = evidence.iter().collect();
        for (i, k) in [1usize, 5, 10, 20].iter().enumerate() {
            let found = ranked
                .iter()
                .take(*k)
                .filter(|d| ev.contains(d))
                .collect::<HashSet<_>>()
                .len();
            self.recall[i] += found as f64 / ev.len() as f64;
        }
        let top10: HashSet<&String> = ranked.iter().take(10).collect();
        self.hit10 += ev.iter().any(|e| top10.contains(e)) as u8 as f64;
        self.all10 += ev.iter().all(|e| top10.contains(e)) as u8 as f64;
        if let Some(pos) = ranked.iter().position(|d| ev.contains(d)) {
            self.mrr += 1.0 / (pos + 1) as f64;
        }
    }
    fn recall10(&self) -> f64 {
        self.recall[2] / self.n.max(1) as f64
    }
    fn row(&self, name: &str) -> String {
        let n = self.n.max(1) as f64;
        format!(
            "| {name:<20} | {:>5} | {:.3} | {:.3} | {:.3} | {:.3} | {:>6.3} | {:>6.3} | {:.3} |",
            self.n,
            self.recall[0] / n,
            self.recall[1] / n,
            self.recall[2] / n,
            self.recall[3] / n,
            self.hit10 / n,
            self.all10 / n,
            self.mrr / n
        )
    }
}

/// `bench locomo`: the weights are chosen on this many conversations (the first), and recall is
/// reported on the rest too.
const TUNE_CONVERSATIONS: usize = 3;

async fn locomo(config: Config, data: &PathBuf, reuse: bool, sweep: bool) -> anyhow::Result<()> {
    let conversations = load_locomo(data)?;
    let h = harness_on(&config, true, !reuse).await?;
    let existing: Option<i64> =
        sqlx::query_scalar("select id from users where email = 'locomo@bench.local'")
            .fetch_optional(&h.state.pool)
            .await?;
    let ingest_again = !(reuse && existing.is_some());
    let (user, key) = match existing {
        Some(id) if reuse => {
            let key = app::core::keys::create(&h.state.pool, id, None, "bench")
                .await
                .map_err(|e| anyhow::anyhow!("{e}"))?;
            (id, key.key)
        }
        _ => h.account("locomo@bench.local").await?,
    };
    println!(
        "# bench locomo: {} ({} conversations)",
        data.display(),
        conversations.len()
    );
    let since = h.db_now().await?;
    let start = Instant::now();
    let mut total_turns = 0;
    let mut posters = vec![];
    for conv in conversations.iter().filter(|_| ingest_again) {
        h.post(
            &key,
            "/api/v1/projects",
            &json!({"name": format!("locomo-{}", conv.id)}),
        )
        .await?;
        let payloads: Vec<Value> = conv
            .turns
            .iter()
            .map(|(dia, content, session, date)| json!({"content": content, "project_id": format!("locomo-{}", conv.id), "metadata": {"dia_id": dia, "session": session, "event_time": date}}))
            .collect();
        total_turns += payloads.len();
        // Each conversation is stored turn by turn, in order, as an agent would; the
        // conversations go in side by side.
        let (http, base, key) = (h.http.clone(), h.base.clone(), key.clone());
        posters.push(tokio::spawn(async move {
            for p in payloads {
                let r = http
                    .post(format!("{base}/api/v1/memories"))
                    .header("x-api-key", &key)
                    .json(&p)
                    .send()
                    .await?;
                anyhow::ensure!(r.status().is_success(), "POST {}", r.status());
            }
            Ok::<_, anyhow::Error>(())
        }));
    }
    for poster in posters {
        poster.await??;
    }
    h.wait_all(user, total_turns, since).await?;
    if ingest_again {
        println!(
            "ingested {total_turns} turns through the API in {:.1} s",
            start.elapsed().as_secs_f64()
        );
    } else {
        println!("reusing the memories ingested by the previous run");
    }

    // The fused search over HTTP, as clients use it.
    let mut by_category: HashMap<i64, Scores> = HashMap::new();
    let mut overall = Scores::default();
    let mut latencies = vec![];
    // Each part alone, the fusion without one of its parts, and the fusion, through the same
    // code path (no HTTP), for comparison.
    let fused = Weights::default();
    let mut variants = vec![
        ("vector only".to_string(), Weights::only(1.0, 0.0)),
        ("keyword only".to_string(), Weights::only(0.0, 1.0)),
        (
            "fused, no dates".to_string(),
            Weights { date: 0.0, ..fused },
        ),
        (
            "fused, no neighbours".to_string(),
            Weights {
                neighbour: 0.0,
                area: 0.0,
                context_terms: 0.0,
                ..fused
            },
        ),
        ("fused, no area".to_string(), Weights { area: 0.0, ..fused }),
        (
            "fused, no authors".to_string(),
            Weights {
                author: 0.0,
                ..fused
            },
        ),
        ("fused".to_string(), fused),
    ];
    if sweep {
        for v in [0.5f32, 0.6, 0.7] {
            for neighbour in [0.2f32, 0.3, 0.4] {
                for context_terms in [0.2, 0.3, 0.5] {
                    variants.push((
                        format!("v{v:.1} n{neighbour:.1} c{context_terms:.1}"),
                        Weights {
                            vector: v,
                            keyword: 0.95 - v,
                            neighbour,
                            context_terms,
                            ..fused
                        },
                    ));
                }
            }
        }
        for date in [0.1f32, 0.3] {
            variants.push((format!("date {date:.1}"), Weights { date, ..fused }));
        }
        for area in [0.2f32, 0.4] {
            variants.push((format!("area {area:.1}"), Weights { area, ..fused }));
        }
        for author in [0.05f32, 0.1, 0.2, 0.25] {
            variants.push((format!("author {author:.2}"), Weights { author, ..fused }));
        }
    }
    let mut variant_scores = vec![Scores::default(); variants.len()];
    // Weights are chosen on the first three conversations (tune) and reported on the others.
    let mut split_scores = vec![[Scores::default(), Scores::default()]; variants.len()];
    let mut http_split = [Scores::default(), Scores::default()];
    for (c, conv) in conversations.iter().enumerate() {
        let split = usize::from(c >= TUNE_CONVERSATIONS);
        let project = format!("locomo-{}", conv.id);
        for (question, category, evidence) in &conv.questions {
            let t = Instant::now();
            let v = h
                .post(
                    &key,
                    "/api/v1/memories/search",
                    &json!({"query": question, "project_id": project, "limit": 20}),
                )
                .await?;
            latencies.push(t.elapsed().as_secs_f64() * 1e3);
            let ranked: Vec<String> = v["data"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|hit| hit["metadata"]["dia_id"].as_str().map(str::to_string))
                .collect();
            by_category
                .entry(*category)
                .or_default()
                .add(&ranked, evidence);
            overall.add(&ranked, evidence);
            http_split[split].add(&ranked, evidence);
            for (i, (_, w)) in variants.iter().enumerate() {
                let (hits, _) = search::search_with(
                    &h.state.pool,
                    &h.state.embedder,
                    user,
                    Some(&project),
                    question,
                    20,
                    *w,
                )
                .await
                .map_err(|e| anyhow::anyhow!("{e}"))?;
                let ranked: Vec<String> = hits
                    .iter()
                    .filter_map(|hit| hit.metadata["dia_id"].as_str().map(str::to_string))
                    .collect();
                variant_scores[i].add(&ranked, evidence);
                split_scores[i][split].add(&ranked, evidence);
            }
        }
    }
    const NAMES: [&str; 5] = ["", "multi-hop", "temporal", "open-domain", "single-hop"];
    println!(
        "\n| category             |     n |  R@1  |  R@5  | R@10  | R@20  | hit@10 | all@10 |  MRR  |"
    );
    println!("|----------------------|-------|-------|-------|-------|-------|--------|--------|-------|");
    for c in 1..=4 {
        if let Some(s) = by_category.get(&c) {
            println!("{}", s.row(&format!("{c} {}", NAMES[c as usize])));
        }
    }
    println!("{}", overall.row("overall"));
    println!(
        "{}",
        http_split[0].row(&format!("tune (conv. 1-{TUNE_CONVERSATIONS})"))
    );
    println!(
        "{}",
        http_split[1].row(&format!("report (conv. {}-)", TUNE_CONVERSATIONS + 1))
    );
    let latencies = sorted(latencies);
    println!(
        "\nsearch latency over HTTP (limit 20): p50 {:.1} ms, p95 {:.1} ms ({} searches)",
        percentile(&latencies, 50.0),
        percentile(&latencies, 95.0),
        latencies.len()
    );
    println!("\nparts alone vs fusion (same questions, overall):");
    println!("| ranking              |     n |  R@1  |  R@5  | R@10  | R@20  | hit@10 | all@10 |  MRR  |");
    println!("|----------------------|-------|-------|-------|-------|-------|--------|--------|-------|");
    for (i, (name, _)) in variants.iter().enumerate() {
        println!("{}", variant_scores[i].row(name));
    }
    println!("\nrecall@10 per split: tune (conversations 1-{TUNE_CONVERSATIONS}, where weights are chosen) | report (the others) | gap");
    for (i, (name, _)) in variants.iter().enumerate() {
        let [tune, report] = &split_scores[i];
        println!(
            "  {name:<24} {:.3} | {:.3} | {:+.3}",
            tune.recall10(),
            report.recall10(),
            report.recall10() - tune.recall10()
        );
    }
    Ok(())
}

/// What a running server's autovacuum and checkpointer would have done after a bulk load:
/// VACUUM (hint bits, visibility map) and ANALYZE, then CHECKPOINT. Without the checkpoint every
/// search evicts pages the load left dirty and writes them first (in psql here, with stored
/// memories' vectors as queries, an HNSW scan took 10 to 25 ms before and 2 to 5 ms after). CHECKPOINT needs the `pg_checkpoint` role (setup grants
/// it); without it the figures say so.
async fn settle(conn: &mut sqlx::PgConnection) -> anyhow::Result<&'static str> {
    sqlx::query("vacuum (analyze) memories")
        .execute(&mut *conn)
        .await?;
    Ok(match sqlx::query("checkpoint").execute(&mut *conn).await {
        Ok(_) => "",
        Err(e) => {
            eprintln!("# CHECKPOINT refused ({e}): the figures include writing the load's dirty pages back");
            " (not checkpointed)"
        }
    })
}

/// Stores memories with their embeddings directly (no queue): a bench account of a given size.
async fn insert_memories(
    pool: &PgPool,
    user: i64,
    contents: &[String],
    vectors: &[&[f32]],
) -> anyhow::Result<()> {
    let embeddings: Vec<String> = vectors
        .iter()
        .map(|v| {
            format!(
                "[{}]",
                v.iter()
                    .map(|x| x.to_string())
                    .collect::<Vec<_>>()
                    .join(",")
            )
        })
        .collect();
    sqlx::query(
        "insert into memories (id, user_id, project_id, content, metadata, cognitive_sector, importance_score, embedding, embedding_model)
         select gen_random_uuid(), $1, 'default', c, '{}'::jsonb, 'semantic', 0.5, e::vector, 'all-MiniLM-L6-v2'
         from unnest($2::text[], $3::text[]) as u(c, e)",
    )
    .bind(user)
    .bind(contents)
    .bind(&embeddings)
    .execute(pool)
    .await?;
    Ok(())
}

async fn search_latency(
    config: Config,
    sizes: &[usize],
    queries: usize,
    data: &PathBuf,
) -> anyhow::Result<()> {
    let conversations = load_locomo(data)?;
    let h = harness(&config, false).await?;
    let (user, key) = h.account("latency@bench.local").await?;
    let pool: &PgPool = &h.state.pool;
    // Real embeddings of real turns; larger sizes combine two turns (vector: the normalised sum),
    // so every row is distinct and the neighbourhoods stay realistic.
    let base: Vec<String> = conversations
        .iter()
        .flat_map(|c| c.turns.iter().map(|t| t.1.clone()))
        .collect();
    let questions: Vec<String> = conversations
        .iter()
        .flat_map(|c| c.questions.iter().map(|q| q.0.clone()))
        .collect();
    let start = Instant::now();
    let vectors = h.state.embedder.embed_many(&base).await?;
    println!(
        "# bench search: corpus from {} real turns (embedded in {:.1} s), {} questions as queries",
        base.len(),
        start.elapsed().as_secs_f64(),
        questions.len()
    );
    let mut rng = StdRng::seed_from_u64(42);
    let mut inserted = 0usize;
    for &size in sizes {
        sqlx::query("drop index if exists memories_embedding_idx")
            .execute(pool)
            .await?;
        while inserted < size {
            let n = (size - inserted).min(2000);
            let (mut contents, mut embeddings) = (Vec::with_capacity(n), Vec::with_capacity(n));
            for _ in 0..n {
                let (i, j) = (
                    rng.random_range(0..base.len()),
                    rng.random_range(0..base.len()),
                );
                let (content, v) = if inserted < base.len() {
                    (
                        base[inserted % base.len()].clone(),
                        vectors[inserted % base.len()].clone(),
                    )
                } else {
                    let mut v: Vec<f32> = vectors[i]
                        .iter()
                        .zip(&vectors[j])
                        .map(|(a, b)| a + 0.5 * b)
                        .collect();
                    let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt().max(1e-9);
                    v.iter_mut().for_each(|x| *x /= norm);
                    (format!("{} / {}", base[i], base[j]), v)
                };
                contents.push(content);
                embeddings.push(v);
                inserted += 1;
            }
            let refs: Vec<&[f32]> = embeddings.iter().map(Vec::as_slice).collect();
            insert_memories(pool, user, &contents, &refs).await?;
        }
        let t = Instant::now();
        let mut conn = pool.acquire().await?;
        sqlx::query("set maintenance_work_mem = '256MB'")
            .execute(&mut *conn)
            .await?;
        sqlx::query("create index memories_embedding_idx on memories using hnsw (embedding vector_cosine_ops)").execute(&mut *conn).await?;
        let built = t.elapsed();
        let settled = settle(&mut conn).await?;
        drop(conn);
        println!(
            "\n{size} memories in one account (HNSW built in {:.1} s){settled}",
            built.as_secs_f64()
        );

        // Warm-up: every pooled connection prepares its statements once (its first search costs
        // about 10 ms more); a running server has long done so.
        for q in questions.iter().take(100) {
            h.post(&key, "/api/v1/memories/search", &json!({"query": q}))
                .await?;
        }
        let mut http_ms = vec![];
        let mut direct_ms = vec![];
        let mut parts: Vec<search::Timings> = vec![];
        for q in questions.iter().cycle().skip(100).take(queries) {
            let t = Instant::now();
            h.post(&key, "/api/v1/memories/search", &json!({"query": q}))
                .await?;
            http_ms.push(t.elapsed().as_secs_f64() * 1e3);
        }
        // The same queries asked again with the recent queries' cache on (filled by a first,
        // untimed pass): what a repeated query costs.
        h.state
            .embedder
            .set_query_cache(app::core::embed::QUERY_CACHE);
        let mut again_line = String::new();
        for pass in 0..2 {
            let mut again = vec![];
            for q in questions.iter().cycle().skip(100).take(queries) {
                let t = Instant::now();
                h.post(&key, "/api/v1/memories/search", &json!({"query": q}))
                    .await?;
                again.push(t.elapsed().as_secs_f64() * 1e3);
            }
            if pass == 1 {
                let again = sorted(again);
                again_line = format!(
                    "  over HTTP, the same {} queries asked again (query cache): p50 {:.1} ms, p95 {:.1} ms",
                    again.len(),
                    percentile(&again, 50.0),
                    percentile(&again, 95.0)
                );
            }
        }
        h.state.embedder.set_query_cache(0);
        for q in questions.iter().cycle().skip(100 + queries).take(queries) {
            let t = Instant::now();
            let (_, timings) = search::search(pool, &h.state.embedder, user, None, q, 10)
                .await
                .map_err(|e| anyhow::anyhow!("{e}"))?;
            direct_ms.push(t.elapsed().as_secs_f64() * 1e3);
            parts.push(timings);
        }
        let (http_ms, direct_ms_sorted) = (sorted(http_ms), sorted(direct_ms.clone()));
        let direct_sum: f64 = direct_ms.iter().sum();
        // The keyword part runs while the query is embedded, and the vector part once it is:
        // a search waits for the longer path, then for the results' fields. The model's share
        // is the embedding's time; PostgreSQL's the rest.
        let embed_sum: f64 = parts.iter().map(|p| p.embed_ms).sum();
        let db_sum: f64 = parts
            .iter()
            .map(|p| (p.keyword_ms.max(p.embed_ms + p.vector_ms) - p.embed_ms) + p.finish_ms)
            .sum();
        let pick = |f: fn(&search::Timings) -> f64| sorted(parts.iter().map(f).collect());
        let (embed, keyword, vector, finish) = (
            pick(|p| p.embed_ms),
            pick(|p| p.keyword_ms),
            pick(|p| p.vector_ms),
            pick(|p| p.finish_ms),
        );
        println!(
            "  over HTTP (limit 10, {} queries, one at a time): p50 {:.1} ms, p95 {:.1} ms",
            http_ms.len(),
            percentile(&http_ms, 50.0),
            percentile(&http_ms, 95.0)
        );
        println!(
            "  in process: p50 {:.1} ms, p95 {:.1} ms; embedding the query p50 {:.1} ms p95 {:.1} ms ({:.0} % of the time); \
             PostgreSQL: keyword part p50 {:.1} ms p95 {:.1} ms (from the start, beside the embedding), \
             vector part p50 {:.1} ms p95 {:.1} ms (after the embedding), results p50 {:.1} ms p95 {:.1} ms ({:.0} % of the time)",
            percentile(&direct_ms_sorted, 50.0),
            percentile(&direct_ms_sorted, 95.0),
            percentile(&embed, 50.0),
            percentile(&embed, 95.0),
            100.0 * embed_sum / direct_sum,
            percentile(&keyword, 50.0),
            percentile(&keyword, 95.0),
            percentile(&vector, 50.0),
            percentile(&vector, 95.0),
            percentile(&finish, 50.0),
            percentile(&finish, 95.0),
            100.0 * db_sum / direct_sum
        );
        println!("{again_line}");
    }
    Ok(())
}

/// The load bench's results for one kind of request.
#[derive(Default)]
struct KindLoad {
    ms: Vec<f64>,
    errors: usize,
    first_error: Option<String>,
}

/// `n` `engram serve` processes (this binary, API and worker each) on the bench database, on
/// free ports; answers them with their base URLs once each is ready.
async fn serve_processes(
    config: &Config,
    url: &str,
    n: usize,
) -> anyhow::Result<Vec<(std::process::Child, String)>> {
    let exe = std::env::current_exe()?;
    let mut children = vec![];
    for _ in 0..n {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let child = std::process::Command::new(&exe)
            .arg("serve")
            .env("DATABASE_URL", url)
            .env("ENGRAM_BIND", format!("127.0.0.1:{port}"))
            .env("ENGRAM_METRICS_BIND", "off")
            .env("ENGRAM_MODEL_DIR", &config.model_dir)
            .env("ENGRAM_SITE_ROOT", &config.site_root)
            .env("ENGRAM_RATE_API_PER_MIN", "1000000000")
            // LoCoMo has 760 questions: over a round most would be asked again and answered
            // from the query cache. Real users' queries repeat less; time the model.
            .env("ENGRAM_QUERY_CACHE", "0")
            .env("RUST_LOG", "warn")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()?;
        children.push((child, format!("http://127.0.0.1:{port}")));
    }
    let http = reqwest::Client::new();
    for (_, base) in &children {
        let mut ready = false;
        for _ in 0..600 {
            if let Ok(r) = http.get(format!("{base}/api/ready")).send().await {
                if r.status() == 200 {
                    ready = true;
                    break;
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        anyhow::ensure!(ready, "engram serve at {base} never became ready");
    }
    Ok(children)
}

/// A process's resident memory now and at its peak (`VmRSS`, `VmHWM`), in MiB.
fn rss_mib(pid: u32) -> (f64, f64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
            .map(|kb| kb / 1024.0)
            .unwrap_or(0.0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// Mixed load against real `engram serve` processes: `accounts` accounts holding `memories`
/// real LoCoMo turns between them, then `clients` clients, each sending its next request as
/// soon as the last is answered, for `seconds`: a search (a LoCoMo question) with probability
/// `search_share`, otherwise a new memory (a LoCoMo turn). Once against one process, then
/// against each count in `processes` (clients spread evenly). Between rounds the queue is
/// drained, so a round does not embed the last one's writes.
#[allow(clippy::too_many_arguments)]
async fn load(
    config: Config,
    clients: usize,
    seconds: u64,
    search_share: f64,
    accounts: usize,
    memories: usize,
    processes: &[usize],
    data: &PathBuf,
) -> anyhow::Result<()> {
    let conversations = load_locomo(data)?;
    let h = harness(&config, false).await?;
    let pool = h.state.pool.clone();
    let (turns, questions) = turns_and_questions(&conversations);
    let vectors = h.state.embedder.embed_many(&turns).await?;
    sqlx::query("drop index if exists memories_embedding_idx")
        .execute(&pool)
        .await?;
    let mut keys = vec![];
    let mut rng = StdRng::seed_from_u64(7);
    let per_account = memories / accounts.max(1);
    for a in 0..accounts {
        let (user, key) = h.account(&format!("load{a}@bench.local")).await?;
        keys.push(key);
        let mut inserted = 0;
        while inserted < per_account {
            let n = (per_account - inserted).min(2000);
            let (mut contents, mut embeddings) = (vec![], vec![]);
            for _ in 0..n {
                // Each account's first turns as they are, then pairs of turns (vector: the
                // normalised sum), so every row is distinct.
                if inserted < turns.len() {
                    let i = (inserted + a * 97) % turns.len();
                    contents.push(turns[i].clone());
                    embeddings.push(vectors[i].clone());
                } else {
                    let (i, j) = (
                        rng.random_range(0..turns.len()),
                        rng.random_range(0..turns.len()),
                    );
                    let mut v: Vec<f32> = vectors[i]
                        .iter()
                        .zip(&vectors[j])
                        .map(|(x, y)| x + 0.5 * y)
                        .collect();
                    let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt().max(1e-9);
                    v.iter_mut().for_each(|x| *x /= norm);
                    contents.push(format!("{} / {}", turns[i], turns[j]));
                    embeddings.push(v);
                }
                inserted += 1;
            }
            let refs: Vec<&[f32]> = embeddings.iter().map(Vec::as_slice).collect();
            insert_memories(&pool, user, &contents, &refs).await?;
        }
    }
    {
        let mut conn = pool.acquire().await?;
        sqlx::query("set maintenance_work_mem = '256MB'")
            .execute(&mut *conn)
            .await?;
        sqlx::query("create index memories_embedding_idx on memories using hnsw (embedding vector_cosine_ops)")
            .execute(&mut *conn)
            .await?;
        settle(&mut conn).await?;
    }
    let mean_turn =
        turns.iter().map(|t| t.chars().count()).sum::<usize>() as f64 / turns.len() as f64;
    println!(
        "# bench load: {accounts} accounts × {per_account} memories (real LoCoMo turns), {clients} clients \
         each sending its next request when answered, {:.0} % searches (LoCoMo questions) and {:.0} % \
         new memories (LoCoMo turns, mean {mean_turn:.0} characters), {seconds} s per round; \
         the clients run in this process, on the same {} cores",
        100.0 * search_share,
        100.0 * (1.0 - search_share),
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
    );
    let url = replace_db(&config.database_url, "engram_bench");
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(clients)
        .timeout(Duration::from_secs(60))
        .build()?;
    let turns = Arc::new(turns);
    let questions = Arc::new(questions);
    let keys = Arc::new(keys);
    for &n in processes {
        let mut children = serve_processes(&config, &url, n).await?;
        let bases: Vec<String> = children.iter().map(|(_, b)| b.clone()).collect();
        let pids: Vec<u32> = children.iter().map(|(c, _)| c.id()).collect();
        // Warm-up: each process's connections prepare their statements and its model is
        // loaded (a few searches and one write per account).
        for base in &bases {
            for key in keys.iter() {
                for q in questions.iter().take(3) {
                    let r = http
                        .post(format!("{base}/api/v1/memories/search"))
                        .header("x-api-key", key)
                        .json(&json!({"query": q}))
                        .send()
                        .await?;
                    anyhow::ensure!(r.status().is_success(), "warm-up search: {}", r.status());
                }
            }
        }
        let tasks_before: i64 = sqlx::query_scalar("select count(*) from tasks")
            .fetch_one(&pool)
            .await?;
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let started = Instant::now();
        let handles: Vec<_> = (0..clients)
            .map(|c| {
                let (http, bases, keys, turns, questions, stop) = (
                    http.clone(),
                    bases.clone(),
                    keys.clone(),
                    turns.clone(),
                    questions.clone(),
                    stop.clone(),
                );
                tokio::spawn(async move {
                    let mut rng = StdRng::seed_from_u64(1000 + c as u64);
                    let base = &bases[c % bases.len()];
                    let key = &keys[c % keys.len()];
                    let (mut search, mut write) = (KindLoad::default(), KindLoad::default());
                    while !stop.load(Ordering::Relaxed) {
                        let is_search = rng.random_bool(search_share);
                        let req = if is_search {
                            let q = &questions[rng.random_range(0..questions.len())];
                            http.post(format!("{base}/api/v1/memories/search"))
                                .json(&json!({"query": q}))
                        } else {
                            let t = &turns[rng.random_range(0..turns.len())];
                            http.post(format!("{base}/api/v1/memories"))
                                .json(&json!({"content": t}))
                        };
                        let t = Instant::now();
                        let outcome = match req.header("x-api-key", key).send().await {
                            Ok(r) if r.status().is_success() => {
                                r.bytes().await.map(|_| ()).map_err(|e| e.to_string())
                            }
                            Ok(r) => Err(format!("HTTP {}", r.status())),
                            Err(e) => Err(e.to_string()),
                        };
                        let ms = t.elapsed().as_secs_f64() * 1e3;
                        let kind = if is_search { &mut search } else { &mut write };
                        match outcome {
                            Ok(()) => kind.ms.push(ms),
                            Err(e) => {
                                kind.errors += 1;
                                kind.first_error.get_or_insert(e);
                            }
                        }
                    }
                    (search, write)
                })
            })
            .collect();
        let mut peak_rss = vec![0.0f64; pids.len()];
        while started.elapsed() < Duration::from_secs(seconds) {
            tokio::time::sleep(Duration::from_millis(500)).await;
            for (i, pid) in pids.iter().enumerate() {
                peak_rss[i] = peak_rss[i].max(rss_mib(*pid).0);
            }
        }
        stop.store(true, Ordering::Relaxed);
        let (mut search, mut write) = (KindLoad::default(), KindLoad::default());
        for handle in handles {
            let (s, w) = handle.await?;
            for (into, from) in [(&mut search, s), (&mut write, w)] {
                into.ms.extend(from.ms);
                into.errors += from.errors;
                if into.first_error.is_none() {
                    into.first_error = from.first_error;
                }
            }
        }
        let elapsed = started.elapsed().as_secs_f64();
        let hwm: Vec<f64> = pids.iter().map(|p| rss_mib(*p).1).collect();
        let written: i64 = sqlx::query_scalar("select count(*) from tasks")
            .fetch_one(&pool)
            .await?;
        let backlog: i64 = sqlx::query_scalar(
            "select count(*) from tasks where status in ('pending', 'processing')",
        )
        .fetch_one(&pool)
        .await?;
        println!(
            "\n{n} process{}: {:.0} requests/s answered ({:.0} searches/s, {:.0} writes/s)",
            if n == 1 {
                format!(" ({clients} clients)")
            } else {
                format!("es ({} clients each)", clients / n)
            },
            (search.ms.len() + write.ms.len()) as f64 / elapsed,
            search.ms.len() as f64 / elapsed,
            write.ms.len() as f64 / elapsed
        );
        for (name, kind) in [("search", &search), ("write", &write)] {
            let ms = sorted(kind.ms.clone());
            println!(
                "  {name:<6} {:>6} answered: p50 {:.1} ms, p99 {:.1} ms; errors {}{}",
                ms.len(),
                percentile(&ms, 50.0),
                percentile(&ms, 99.0),
                kind.errors,
                kind.first_error
                    .as_ref()
                    .map(|e| format!(" (first: {e})"))
                    .unwrap_or_default()
            );
        }
        for (i, pid) in pids.iter().enumerate() {
            println!(
                "  process {} (pid {pid}): RSS peak during the round {:.0} MiB (VmHWM {:.0} MiB)",
                i + 1,
                peak_rss[i],
                hwm[i]
            );
        }
        // The writes are acknowledged when queued; the workers embed them at the model's pace.
        let drain = Instant::now();
        let mut left = backlog;
        while left > 0 && drain.elapsed() < Duration::from_secs(900) {
            tokio::time::sleep(Duration::from_millis(500)).await;
            left = sqlx::query_scalar(
                "select count(*) from tasks where status in ('pending', 'processing')",
            )
            .fetch_one(&pool)
            .await?;
        }
        let failed: i64 = sqlx::query_scalar("select count(*) from tasks where status = 'failed'")
            .fetch_one(&pool)
            .await?;
        println!(
            "  {} memories written; {backlog} still queued at the end, embedded {:.0} s later ({left} left), {failed} failed",
            written - tasks_before,
            drain.elapsed().as_secs_f64()
        );
        for (child, _) in children.iter_mut() {
            let _ = std::process::Command::new("kill")
                .args(["-TERM", &child.id().to_string()])
                .status();
        }
        for (child, _) in children.iter_mut() {
            let _ = child.wait();
        }
    }
    Ok(())
}

/// `bench importance`: the scores `classify::importance` gives the rated memories (as the first
/// memory of an account: full novelty) against the people's ratings.
fn importance_rank() {
    use app::core::classify::{importance, rated_importance, spearman};
    let rows = rated_importance();
    let scored: Vec<(u8, bool, String, f64)> = rows
        .iter()
        .map(|(rating, held, kind, text)| {
            (
                *rating,
                *held,
                kind.clone(),
                f64::from(importance(1, text, None)),
            )
        })
        .collect();
    // Spearman over the rows of one half (`Some(held)`) or all of them.
    let rho = |half: Option<bool>| {
        let chosen: Vec<_> = scored
            .iter()
            .filter(|r| half.is_none_or(|held| r.1 == held))
            .collect();
        let a: Vec<f64> = chosen.iter().map(|r| f64::from(r.0)).collect();
        let b: Vec<f64> = chosen.iter().map(|r| r.3).collect();
        (spearman(&a, &b), chosen.len())
    };
    println!("# bench importance: app/data/importance/rated.tsv, ratings 1 (idle) to 3 (vital)");
    for (name, half) in [
        ("dev (weights chosen on it)", Some(false)),
        ("held out", Some(true)),
        ("all", None),
    ] {
        let (r, n) = rho(half);
        println!("Spearman {name}: {r:.3} ({n} memories)");
    }
    for kind in ["short-vital", "long-idle", "plain"] {
        for rating in 1..=3u8 {
            let s: Vec<f64> = scored
                .iter()
                .filter(|r| r.2 == kind && r.0 == rating)
                .map(|r| r.3)
                .collect();
            if !s.is_empty() {
                println!(
                    "  {kind:<11} rated {rating}: {} memories, mean score {:.2} (min {:.2}, max {:.2})",
                    s.len(),
                    s.iter().sum::<f64>() / s.len() as f64,
                    s.iter().cloned().fold(f64::MAX, f64::min),
                    s.iter().cloned().fold(f64::MIN, f64::max)
                );
            }
        }
    }
}

async fn classifier(config: &Config, show_errors: bool) -> anyhow::Result<()> {
    use app::core::classify::{self, Scores, SECTORS};
    let embedder = EmbedderHandle::new(&config.model_dir);
    let started = std::time::Instant::now();
    let e = classify::evaluate(&embedder).await?;
    println!(
        "training rows: {} (train.tsv, protos.tsv, implicit.tsv); held out: {} (held_out.tsv, implicit, never learned from)",
        classify::training_rows().len(),
        e.held_out.total
    );
    println!("5-fold cross-validation on the training rows (choices are made here):");
    for (label, accuracy) in &e.cross_validation {
        println!("  {:<52} {:.1} %", label, 100.0 * accuracy);
    }
    if show_errors {
        println!("training rows the shipped options miss in cross-validation:");
        for (truth, predicted, text) in &e.cross_validation_errors {
            println!("  {} -> {}: {text}", SECTORS[*truth], SECTORS[*predicted]);
        }
    }
    let report = |title: &str, s: &Scores| {
        println!(
            "{title}: {}/{} = {:.1} %",
            s.correct,
            s.total,
            100.0 * s.accuracy()
        );
    };
    report("held-out implicit rows, shipped head", &e.held_out);
    println!("  sector       precision  recall   confusion (columns: predicted, in the order of the rows)");
    for (i, name) in SECTORS.iter().enumerate() {
        let (p, r) = e.held_out.precision_recall(i);
        println!(
            "  {name:<11}  {:>8.2}  {:>6.2}   {:?}",
            p, r, e.held_out.confusion[i]
        );
    }
    report(
        "held-out implicit rows, nearest centroid (before)",
        &e.held_out_centroid,
    );
    report(
        "every fifth row of train.tsv held out, head learned from the rest",
        &e.explicit_fifth,
    );
    let near = |at: f32| e.closest_training.iter().filter(|c| c.0 >= at).count();
    println!(
        "held-out rows' closest training row (cosine): max {:.3}; {} at {} or more (paraphrases), {} at 0.9 or more",
        e.closest_training.first().map_or(0.0, |c| c.0),
        near(classify::NEAR_COPY),
        classify::NEAR_COPY,
        near(0.9)
    );
    if show_errors {
        for (cos, held, train) in e
            .closest_training
            .iter()
            .take_while(|c| c.0 >= classify::NEAR_COPY)
        {
            println!("  {cos:.3}  held out: {held}  |  training: {train}");
        }
    }
    println!("({:.1} s)", started.elapsed().as_secs_f64());
    Ok(())
}
