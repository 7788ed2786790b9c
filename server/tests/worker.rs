//! The ingestion worker: retries, final failure, a SIGKILL in the middle of a job, and two
//! worker processes on one queue. Real PostgreSQL, real apalis, real `engram worker` processes.
mod common;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use serde_json::json;

#[tokio::test]
async fn a_failed_first_try_is_retried_and_stores_one_memory() {
    let mut opts = Opts {
        worker: true,
        ..Opts::default()
    };
    opts.ingest.fail_first_tries = 1;
    let app = spawn_with(opts).await;
    let (_, key) = app.user("retry@example.com").await;
    let task_id = app
        .remember(&key, json!({"content": "the first try of this one fails"}))
        .await;
    let task = app.wait_task(&key, &task_id).await;
    assert_eq!(task["status"], "completed", "{task}");
    let (attempts, memories): (i32, i64) = sqlx::query_as("select attempts, (select count(*) from memories where task_id = tasks.id) from tasks where id = $1::uuid")
        .bind(&task_id)
        .fetch_one(&app.pool)
        .await
        .unwrap();
    assert_eq!((attempts, memories), (2, 1));
}

#[tokio::test]
async fn the_last_failure_leaves_the_task_failed_with_a_readable_error() {
    let mut opts = Opts {
        worker: true,
        ..Opts::default()
    };
    opts.ingest.fail_first_tries = 100;
    opts.ingest.max_tries = 3;
    let app = spawn_with(opts).await;
    let (_, key) = app.user("fail@example.com").await;
    let task_id = app
        .remember(&key, json!({"content": "this one never makes it"}))
        .await;
    let task = app.wait_task(&key, &task_id).await;
    assert_eq!(task["status"], "failed", "{task}");
    let error = task["error"].as_str().unwrap();
    assert!(
        error.contains("after 3 attempts") && error.contains("injected transient failure"),
        "{error}"
    );
    assert!(task["memory_id"].is_null());
    let memories: i64 = sqlx::query_scalar("select count(*) from memories")
        .fetch_one(&app.pool)
        .await
        .unwrap();
    assert_eq!(memories, 0);
}

fn worker_process(db_url: &str, delay_ms: u64) -> Child {
    Command::new(env!("CARGO_BIN_EXE_engram"))
        .arg("worker")
        .env("DATABASE_URL", db_url)
        .env("ENGRAM_MODEL_DIR", app::core::embed::default_model_dir())
        .env("ENGRAM_FAILPOINT_INGEST_DELAY_MS", delay_ms.to_string())
        .env("ENGRAM_WORKER_HEARTBEAT_SECS", "1")
        .env("ENGRAM_WORKER_CONCURRENCY", "4")
        .env("ENGRAM_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("starting `engram worker`")
}

async fn task_status(app: &TestApp, task_id: &str) -> String {
    sqlx::query_scalar("select status from tasks where id = $1::uuid")
        .bind(task_id)
        .fetch_one(&app.pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn a_worker_killed_mid_job_leaves_the_task_to_the_next_worker_and_one_memory() {
    let app = spawn_app().await; // the API only; workers are separate processes
    let (_, key) = app.user("crash@example.com").await;
    let mut slow = worker_process(&app.db_url, 60_000);
    let task_id = app
        .remember(&key, json!({"content": "a memory whose first worker dies"}))
        .await;

    let start = Instant::now();
    while task_status(&app, &task_id).await != "processing" {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the worker never picked the job up"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    slow.kill().expect("SIGKILL"); // Child::kill sends SIGKILL on Unix
    slow.wait().unwrap();
    assert_eq!(task_status(&app, &task_id).await, "processing");

    let mut fresh = worker_process(&app.db_url, 0);
    let task = app.wait_task(&key, &task_id).await;
    fresh.kill().ok();
    fresh.wait().ok();
    assert_eq!(task["status"], "completed", "{task}");
    let memories: i64 =
        sqlx::query_scalar("select count(*) from memories where task_id = $1::uuid")
            .bind(&task_id)
            .fetch_one(&app.pool)
            .await
            .unwrap();
    assert_eq!(memories, 1);
    let attempts: i32 = sqlx::query_scalar("select attempts from tasks where id = $1::uuid")
        .bind(&task_id)
        .fetch_one(&app.pool)
        .await
        .unwrap();
    assert_eq!(
        attempts, 2,
        "one delivery to the killed worker, one to the fresh one"
    );
}

#[tokio::test]
async fn two_worker_processes_never_process_one_job_twice() {
    let app = spawn_app().await;
    let (_, key) = app.user("pair@example.com").await;
    let mut a = worker_process(&app.db_url, 0);
    let mut b = worker_process(&app.db_url, 0);
    // Both workers registered (each loads the model first) before any job is queued.
    let start = Instant::now();
    loop {
        let registered: i64 =
            sqlx::query_scalar("select count(*) from apalis.workers where worker_type = $1")
                .bind(app::core::memories::QUEUE)
                .fetch_one(&app.pool)
                .await
                .unwrap_or(0);
        if registered >= 2 {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the workers did not start"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut tasks = vec![];
    for i in 0..40 {
        tasks.push(
            app.remember(
                &key,
                json!({"content": format!("shared queue memory number {i} about topic {}", i % 7)}),
            )
            .await,
        );
    }
    for t in &tasks {
        assert_eq!(app.wait_task(&key, t).await["status"], "completed");
    }
    a.kill().ok();
    b.kill().ok();
    a.wait().ok();
    b.wait().ok();
    let (memories, distinct, max_attempts): (i64, i64, i32) =
        sqlx::query_as("select count(*), count(distinct m.task_id), max(t.attempts) from memories m join tasks t on t.id = m.task_id").fetch_one(&app.pool).await.unwrap();
    assert_eq!((memories, distinct, max_attempts), (40, 40, 1));
    // Both processes took part: the jobs were locked by two different workers.
    let workers: i64 =
        sqlx::query_scalar("select count(distinct lock_by) from apalis.jobs where job_type = $1")
            .bind(app::core::memories::QUEUE)
            .fetch_one(&app.pool)
            .await
            .unwrap();
    assert_eq!(
        workers, 2,
        "both worker processes should have processed jobs"
    );
}

#[tokio::test]
async fn an_idle_worker_picks_up_each_new_memory_without_waiting_for_its_heartbeat() {
    // A heartbeat far longer than the bound below: with apalis's own pubsub polling, a memory
    // whose notification was spent on a fetch already under way waited for the heartbeat (this
    // test then failed at the third memory, in both of two runs). Now a follow-up wake 25 ms
    // after each notification, or at worst the 1 s fallback poll, fetches it.
    let app = spawn_app().await;
    let ctx = server::ingest_context(&app.state, app::core::ingest::IngestOptions::default());
    let pool = app.pool.clone();
    let worker = tokio::spawn(async move {
        server::worker::run(
            pool,
            ctx,
            8,
            Duration::from_secs(300),
            std::future::pending(),
        )
        .await
        .unwrap();
    });
    let (_, key) = app.user("idle@example.com").await;
    let mut slowest = Duration::ZERO;
    for i in 0..150 {
        let start = Instant::now();
        let task = app
            .remember(
                &key,
                json!({"content": format!("idle memory {i}: the boiler was serviced on day {i}")}),
            )
            .await;
        loop {
            let (_, b) = app.get(&format!("/api/v1/tasks/{task}"), Some(&key)).await;
            if b["data"]["status"] == "completed" {
                break;
            }
            assert_ne!(b["data"]["status"], "failed", "{b}");
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "memory {i} still {} after 20 s: the worker missed its wake-up",
                b["data"]["status"]
            );
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        slowest = slowest.max(start.elapsed());
    }
    worker.abort();
    eprintln!("slowest POST → completed: {slowest:?}");
}

/// A backlog is claimed and stored in a few statements, not one per memory (group commit), and
/// each task still ends with exactly one memory, classified.
#[tokio::test]
async fn a_backlog_is_claimed_and_stored_in_a_few_statements() {
    let app = spawn_app().await;
    let (_, key) = app.user("backlog@example.com").await;
    let n = 32;
    let mut tasks = vec![];
    for i in 0..n {
        tasks.push(
            app.remember(
                &key,
                json!({"content": format!("backlog memory {i}: the team met on day {i} to plan the launch")}),
            )
            .await,
        );
    }
    // The worker starts with all of them queued.
    let ctx = server::ingest_context(&app.state, app::core::ingest::IngestOptions::default());
    let (pool, worker_ctx) = (app.pool.clone(), ctx.clone());
    let worker = tokio::spawn(async move {
        server::worker::run(
            pool,
            worker_ctx,
            32,
            Duration::from_secs(300),
            std::future::pending(),
        )
        .await
        .unwrap();
    });
    for task in &tasks {
        let t = app.wait_task(&key, task).await;
        assert_eq!(t["status"], "completed", "{t}");
        assert!(
            t["cognitive_sector"].is_string() && t["importance_score"].is_number(),
            "{t}"
        );
    }
    worker.abort();
    let (memories, tasks_with_one): (i64, i64) = sqlx::query_as(
        "select (select count(*) from memories),
                (select count(*) from tasks t where (select count(*) from memories m where m.task_id = t.id) = 1)",
    )
    .fetch_one(&app.pool)
    .await
    .unwrap();
    assert_eq!((memories, tasks_with_one), (n, n));
    let claims = ctx
        .claim_statements
        .load(std::sync::atomic::Ordering::Relaxed);
    let stores = ctx
        .store_statements
        .load(std::sync::atomic::Ordering::Relaxed);
    eprintln!("{n} memories: {claims} claim statements, {stores} store statements");
    assert!(
        claims <= 8 && stores <= 8,
        "{claims} claim and {stores} store statements for {n} memories"
    );
}

#[tokio::test]
async fn the_workers_bookkeeping_does_not_wait_for_the_disk_and_its_results_do() {
    // The queue's fetches, locks and acknowledgements and a task's `processing` mark commit
    // without waiting for the WAL flush (a PostgreSQL crash can only undo them into a repeated
    // try); the memory and its task's completion, and the new task with its job, wait.
    let app = spawn_app().await;
    let ctx = server::ingest_context(&app.state, app::core::ingest::IngestOptions::default());
    let setting = "select current_setting('synchronous_commit')";
    let bookkeeping: String = sqlx::query_scalar(setting)
        .fetch_one(&ctx.bookkeeping)
        .await
        .unwrap();
    let results: String = sqlx::query_scalar(setting)
        .fetch_one(&ctx.pool)
        .await
        .unwrap();
    assert_eq!((bookkeeping.as_str(), results.as_str()), ("off", "on"));
    assert_eq!(
        sqlx::query_scalar::<_, String>(setting)
            .fetch_one(&app.state.pool)
            .await
            .unwrap(),
        "on"
    );
}

/// No index of the queue's table is there twice (apalis left two duplicates; a migration drops
/// them): each would be written again for every new job and every change of a job's state.
#[tokio::test]
async fn the_jobs_table_has_no_index_twice() {
    let app = spawn_app().await;
    let indexes: Vec<(String, String)> = sqlx::query_as(
        "select indexrelid::regclass::text,
                indkey::text || ' ' || coalesce(pg_get_expr(indpred, indrelid), '') || ' ' || coalesce(pg_get_expr(indexprs, indrelid), '')
         from pg_index where indrelid = 'apalis.jobs'::regclass order by 1",
    )
    .fetch_all(&app.pool)
    .await
    .unwrap();
    assert!(indexes.len() >= 4, "{indexes:?}");
    let mut definitions: Vec<&str> = indexes.iter().map(|(_, d)| d.as_str()).collect();
    definitions.sort();
    definitions.dedup();
    assert_eq!(
        definitions.len(),
        indexes.len(),
        "an index twice: {indexes:?}"
    );
}

/// A batch of new memories is one statement, and the workers hear of it once: one notification
/// per queue and statement (our trigger replaces apalis's per-row one), in the payload apalis's
/// listener reads, naming the queue and the batch's first job.
#[tokio::test]
async fn a_batch_of_new_jobs_notifies_the_workers_once_per_queue() {
    let app = spawn_app().await;
    let mut listener = sqlx::postgres::PgListener::connect_with(&app.pool)
        .await
        .unwrap();
    listener.listen("apalis::job::insert").await.unwrap();
    sqlx::query(
        "insert into apalis.jobs (id, job_type, job, status, attempts, max_attempts, run_at, priority, metadata, idempotency_key)
         select 'test-' || g, case when g <= 3 then $1 else 'another-queue' end, '\\x00'::bytea, 'Pending', 0, 5, now(), 0, ''::hstore, null
         from generate_series(1, 5) g",
    )
    .bind(app::core::memories::QUEUE)
    .execute(&app.pool)
    .await
    .unwrap();
    let mut heard = vec![];
    while let Ok(n) = tokio::time::timeout(Duration::from_millis(500), listener.recv()).await {
        let payload: serde_json::Value = serde_json::from_str(n.unwrap().payload()).unwrap();
        heard.push((
            payload["job_type"].as_str().unwrap().to_string(),
            payload["id"].as_str().unwrap().to_string(),
        ));
    }
    heard.sort();
    assert_eq!(
        heard,
        vec![
            ("another-queue".to_string(), "test-4".to_string()),
            (app::core::memories::QUEUE.to_string(), "test-1".to_string()),
        ],
        "five jobs in two queues, one statement"
    );
}
