//! `engram`: the Engram server.
use std::time::Duration;

use clap::{Parser, Subcommand};

use app::core::embed::EmbedderHandle;
use app::core::ingest::IngestOptions;
use server::config::Config;

#[derive(Parser)]
#[command(
    name = "engram",
    about = "Engram: a self-hostable memory store for AI applications"
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the API and the portal, with workers (the default).
    Serve {
        /// Run no ingestion worker in this process (run `engram worker` elsewhere).
        #[arg(long)]
        no_worker: bool,
    },
    /// Run ingestion workers only.
    Worker,
    /// Apply the database migrations (or revert ours with --down).
    Migrate {
        #[arg(long)]
        down: bool,
    },
    /// The public model catalogue.
    Models {
        #[command(subcommand)]
        which: ModelsCommand,
    },
    /// Subscription plans: define them, put accounts on them, list them. Changes take effect
    /// at once in every running process.
    Plan {
        #[command(subcommand)]
        which: PlanCommand,
    },
    /// Export an account (projects, conversations, memories with their vectors) as JSON Lines.
    Export {
        /// The account's e-mail.
        email: String,
        /// Where to write; standard output when omitted.
        #[arg(long)]
        out: Option<std::path::PathBuf>,
    },
    /// Import an export into an account, in one transaction.
    Import {
        /// The account's e-mail.
        email: String,
        /// The export (JSON Lines).
        file: std::path::PathBuf,
    },
    /// A stand-in OpenAI-compatible LLM (echoes, streams word by word) for tests and for trying
    /// the proxy without a provider; see `server::standin`.
    StandInLlm {
        /// Address to serve on.
        #[arg(long, default_value = "127.0.0.1:3901")]
        bind: std::net::SocketAddr,
        /// Answer 401 to any other bearer token.
        #[arg(long)]
        key: Option<String>,
        /// Milliseconds between streamed words.
        #[arg(long, default_value_t = 5)]
        delay_ms: u64,
    },
    /// Benchmarks: print measured figures.
    Bench {
        #[command(subcommand)]
        which: server::bench::Bench,
    },
}

#[derive(Subcommand)]
enum PlanCommand {
    /// Create or replace a plan; a quota left out is unlimited.
    Define {
        /// The plan's name: a-z, 0-9, '_' and '-'.
        name: String,
        /// The name people see (default: the name, capitalised).
        #[arg(long)]
        display_name: Option<String>,
        /// The price as people see it (`$9 / month`).
        #[arg(long)]
        price: Option<String>,
        /// Memories stored (queued ones included).
        #[arg(long)]
        memories: Option<i64>,
        /// API calls per calendar month (UTC).
        #[arg(long)]
        api_calls_per_month: Option<i64>,
        /// Searches per day (UTC).
        #[arg(long)]
        searches_per_day: Option<i64>,
        /// LLM proxy tokens (in and out) per calendar month.
        #[arg(long)]
        proxy_tokens_per_month: Option<i64>,
        /// Projects.
        #[arg(long)]
        projects: Option<i64>,
        /// Machine accounts claimed.
        #[arg(long)]
        machines: Option<i64>,
    },
    /// Put an account on a plan.
    Assign {
        /// The account's e-mail.
        email: String,
        /// The plan's name.
        plan: String,
        /// The last day on the plan (`2027-01-31`, through its end, UTC) or an RFC 3339 time;
        /// then the account returns to the default plan.
        #[arg(long)]
        until: Option<String>,
    },
    /// List the plans.
    List,
}

#[derive(Subcommand)]
enum ModelsCommand {
    /// Load litellm's price list (`model_prices_and_context_window_backup.json`) into the
    /// catalogue: new entries added, changed ones updated in place, vanished ones removed.
    Import {
        /// The file; setup extracts it to models/litellm/ from the pinned litellm wheel.
        #[arg(default_value = server::DEFAULT_MODEL_CATALOG)]
        file: std::path::PathBuf,
    },
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    // The model runs on one thread: on this 2-core class of machine two threads embed no faster
    // (68 vs 70 texts/s measured) and starve the HTTP path and PostgreSQL. Set before any thread
    // starts; RAYON_NUM_THREADS in the environment overrides it.
    if std::env::var_os("RAYON_NUM_THREADS").is_none() {
        std::env::set_var("RAYON_NUM_THREADS", "1");
    }
    // A bench prints its figures on stdout: the request log (one line per request) would bury
    // them, so it logs warnings only unless ENGRAM_LOG says otherwise.
    let bench = matches!(cli.command, Some(Command::Bench { .. }));
    server::telemetry::init(if bench { "warn" } else { "info" });
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let config = match Config::from_env() {
            Ok(c) => c,
            Err(e) => {
                eprintln!("engram: {e:#}");
                std::process::exit(2);
            }
        };
        match cli.command.unwrap_or(Command::Serve { no_worker: false }) {
            Command::Serve { no_worker } => serve(config, !no_worker).await,
            Command::Worker => worker(config).await,
            Command::Migrate { down } => {
                let pool = server::connect(&config.database_url).await?;
                if down {
                    server::MIGRATOR.undo(&pool, 0).await?;
                    println!("migrations reverted");
                } else {
                    server::migrate(&pool).await?;
                    println!("migrations applied");
                }
                Ok(())
            }
            Command::Models {
                which: ModelsCommand::Import { file },
            } => {
                let pool = server::connect(&config.database_url).await?;
                server::migrate(&pool).await?;
                let bytes = std::fs::read(&file)
                    .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", file.display()))?;
                let report = app::core::models::import(&pool, &bytes)
                    .await
                    .map_err(|e| anyhow::anyhow!("{e}"))?;
                println!("{}", server::describe_import(&file, &report));
                Ok(())
            }
            Command::Plan { which } => plan_command(&config, which).await,
            Command::Export { email, out } => {
                let (state, user_id) = account_by_email(&config, &email).await?;
                let mut stream = std::pin::pin!(server::api::transfer::export_stream(
                    state.pool.clone(),
                    user_id,
                    Some(email)
                ));
                let mut sink: Box<dyn std::io::Write> = match &out {
                    Some(path) => Box::new(std::io::BufWriter::new(std::fs::File::create(path)?)),
                    None => Box::new(std::io::BufWriter::new(std::io::stdout().lock())),
                };
                use futures::StreamExt;
                while let Some(chunk) = stream.next().await {
                    sink.write_all(&chunk?)?;
                }
                sink.flush()?;
                Ok(())
            }
            Command::Import { email, file } => {
                let (state, user_id) = account_by_email(&config, &email).await?;
                let reader = tokio::fs::File::open(&file)
                    .await
                    .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", file.display()))?;
                let chunks = file_chunks(reader);
                let report = server::api::transfer::import_stream(&state, user_id, chunks)
                    .await
                    .map_err(|e| anyhow::anyhow!("{}", e.user_message()))?;
                println!("{}", serde_json::to_string_pretty(&report)?);
                Ok(())
            }
            Command::StandInLlm {
                bind,
                key,
                delay_ms,
            } => {
                let listener = tokio::net::TcpListener::bind(bind).await?;
                println!("stand-in LLM on http://{bind}/v1");
                let options = server::standin::Options {
                    key,
                    delay_ms,
                    ..Default::default()
                };
                server::standin::serve(listener, options).await
            }
            Command::Bench { which } => server::bench::run(config, which).await,
        }
    })
}

/// `engram plan …`.
async fn plan_command(config: &Config, which: PlanCommand) -> anyhow::Result<()> {
    use app::core::plans;
    let pool = server::connect(&config.database_url).await?;
    server::migrate(&pool).await?;
    let fail = |e: app::core::error::AppError| anyhow::anyhow!("{}", e.user_message());
    match which {
        PlanCommand::Define {
            name,
            display_name,
            price,
            memories,
            api_calls_per_month,
            searches_per_day,
            proxy_tokens_per_month,
            projects,
            machines,
        } => {
            let plan = plans::define(
                &pool,
                &name,
                display_name.as_deref(),
                price.as_deref(),
                [
                    memories,
                    api_calls_per_month,
                    searches_per_day,
                    proxy_tokens_per_month,
                    projects,
                    machines,
                ],
            )
            .await
            .map_err(fail)?;
            println!("plan {} defined", plan.name);
            print_plans(&[plan]);
        }
        PlanCommand::Assign { email, plan, until } => {
            let until = until.as_deref().map(parse_until).transpose()?;
            plans::assign(&pool, &email, &plan, until)
                .await
                .map_err(fail)?;
            match until {
                Some(t) => println!(
                    "{email} is on the {plan} plan until {}",
                    app::core::time::iso(t)
                ),
                None => println!("{email} is on the {plan} plan"),
            }
        }
        PlanCommand::List => print_plans(&plans::list(&pool).await.map_err(fail)?),
    }
    Ok(())
}

/// `2027-01-31` (through the end of that day, UTC) or an RFC 3339 time.
fn parse_until(text: &str) -> anyhow::Result<chrono::DateTime<chrono::Utc>> {
    if let Ok(day) = chrono::NaiveDate::parse_from_str(text, "%Y-%m-%d") {
        let next = day + chrono::Duration::days(1);
        return Ok(next.and_hms_opt(0, 0, 0).expect("midnight").and_utc());
    }
    chrono::DateTime::parse_from_rfc3339(text)
        .map(|t| t.with_timezone(&chrono::Utc))
        .map_err(|_| {
            anyhow::anyhow!("--until {text:?}: give a day (2027-01-31) or an RFC 3339 time")
        })
}

fn print_plans(plans: &[app::core::plans::Plan]) {
    let show = |l: Option<i64>| l.map_or_else(|| "unlimited".to_string(), |n| n.to_string());
    println!(
        "{:<16} {:<20} {:>12} {:>16} {:>14} {:>18} {:>10} {:>10}  price",
        "name",
        "display",
        "memories",
        "api/month",
        "searches/day",
        "proxy tokens/mo",
        "projects",
        "machines"
    );
    for p in plans {
        let l = &p.limits;
        println!(
            "{:<16} {:<20} {:>12} {:>16} {:>14} {:>18} {:>10} {:>10}  {}{}",
            p.name,
            p.display_name,
            show(l[0]),
            show(l[1]),
            show(l[2]),
            show(l[3]),
            show(l[4]),
            show(l[5]),
            p.price_label,
            if p.is_default { "  (default)" } else { "" }
        );
    }
}

fn ingest_options(config: &Config) -> IngestOptions {
    IngestOptions {
        delay_after_start: Duration::from_millis(config.failpoint_ingest_delay_ms),
        ..IngestOptions::default()
    }
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("installing the SIGTERM handler");
    tokio::select! {
        _ = ctrl_c => {},
        _ = term.recv() => {},
    }
}

/// Connects, migrates and builds the process's state (serve and worker alike).
async fn start(config: &Config) -> anyhow::Result<(sqlx::PgPool, app::core::state::AppState)> {
    let pool = server::connect(&config.database_url)
        .await
        .map_err(|e| anyhow::anyhow!("cannot reach PostgreSQL at DATABASE_URL: {e}"))?;
    server::migrate(&pool).await?;
    let embedder = EmbedderHandle::new(&config.model_dir);
    embedder.set_query_cache(config.query_cache);
    let state = server::build_state(
        pool.clone(),
        config.settings.clone(),
        embedder,
        &config.site_root.to_string_lossy(),
    );
    Ok((pool, state))
}

async fn serve(config: Config, with_worker: bool) -> anyhow::Result<()> {
    let (pool, state) = start(&config).await?;
    server::seed_model_catalog(&pool, &config.model_catalog).await;
    app::core::plans::set_default(&pool, &config.settings.billing.default_plan)
        .await
        .map_err(|e| anyhow::anyhow!("{}", e.user_message()))?;
    server::spawn_housekeeping(state.clone(), Duration::from_secs(5));
    server::spawn_quota_refresh(state.clone());
    // One SIGTERM (or Ctrl-C) stops both: the HTTP server stops accepting and finishes its
    // requests, the worker stops fetching and finishes its jobs; then the process exits.
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        shutdown_signal().await;
        tracing::info!("stopping: finishing in-flight requests and jobs");
        let _ = stop_tx.send(true);
    });
    let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|stop| *stop).await;
    };
    let mut worker_done = None;
    if with_worker {
        let ctx = server::ingest_context(&state, ingest_options(&config));
        let (concurrency, heartbeat) = (
            config.worker_concurrency,
            Duration::from_secs(config.heartbeat_secs),
        );
        let stop = stopped(stop_rx.clone());
        worker_done = Some(tokio::spawn(async move {
            if let Err(e) = ctx.warm_up().await {
                tracing::error!(error = %format!("{e:#}"), "the embedding model could not be loaded");
            }
            if let Err(e) = server::worker::run(pool, ctx, concurrency, heartbeat, stop).await {
                tracing::error!(error = %format!("{e:#}"), "worker stopped");
            }
        }));
    }
    if let Some(addr) = config.metrics_bind {
        // Recording starts now; the scrape address is the operator's, never the public one. A
        // second process on the machine finds it taken: it serves the rest without it.
        server::metrics::handle();
        match tokio::net::TcpListener::bind(addr).await {
            Ok(listener) => {
                tracing::info!(url = %format!("http://{addr}/metrics"), "metrics");
                let router = server::metrics::router(state.clone());
                tokio::spawn(async move { axum::serve(listener, router).await });
            }
            Err(e) => tracing::warn!(%addr, error = %e, "metrics not served: the address is taken"),
        }
    }
    let listener = tokio::net::TcpListener::bind(config.bind)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on {}: {e}", config.bind))?;
    let url = format!("http://{}", listener.local_addr()?);
    tracing::info!(%url, "Engram is serving the portal and the API");
    println!("Engram is running on {url} (portal at /, API under /api)");
    axum::serve(
        listener,
        server::router(state).into_make_service_with_connect_info::<std::net::SocketAddr>(),
    )
    .with_graceful_shutdown(stopped(stop_rx))
    .await?;
    if let Some(worker) = worker_done {
        // The jobs under way finish (a job is a forward pass and a write: seconds at most).
        if tokio::time::timeout(WORKER_DRAIN, worker).await.is_err() {
            tracing::warn!("the worker's jobs did not finish in time; they will be retried");
        }
    }
    tracing::info!("stopped");
    Ok(())
}

/// Longest a stopping `serve` waits for its worker's jobs.
const WORKER_DRAIN: Duration = Duration::from_secs(30);

/// The state of a one-off command and the account with `email`.
async fn account_by_email(
    config: &Config,
    email: &str,
) -> anyhow::Result<(app::core::state::AppState, i64)> {
    let (_, state) = start(config).await?;
    let id: Option<i64> = sqlx::query_scalar("select id from users where email = lower($1)")
        .bind(email.trim())
        .fetch_optional(&state.pool)
        .await?;
    let id = id.ok_or_else(|| anyhow::anyhow!("no account with the e-mail {email}"))?;
    Ok((state, id))
}

/// A file read as a stream of chunks (ends after an error).
fn file_chunks(
    file: tokio::fs::File,
) -> std::pin::Pin<Box<dyn futures::Stream<Item = Result<bytes::Bytes, std::io::Error>> + Send>> {
    use tokio::io::AsyncReadExt;
    Box::pin(futures::stream::unfold(Some(file), |file| async move {
        let mut file = file?;
        let mut buf = vec![0u8; 1 << 16];
        match file.read(&mut buf).await {
            Ok(0) => None,
            Ok(n) => {
                buf.truncate(n);
                Some((Ok(bytes::Bytes::from(buf)), Some(file)))
            }
            Err(e) => Some((Err(e), None)),
        }
    }))
}

async fn worker(mut config: Config) -> anyhow::Result<()> {
    // A worker answers no API calls: no key cache, so no connection listening for key changes.
    config.settings.key_cache = false;
    let (pool, state) = start(&config).await?;
    let ctx = server::ingest_context(&state, ingest_options(&config));
    ctx.warm_up().await?;
    server::worker::run(
        pool,
        ctx,
        config.worker_concurrency,
        Duration::from_secs(config.heartbeat_secs),
        shutdown_signal(),
    )
    .await
}
