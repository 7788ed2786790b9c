//! Deployments as they run: several `engram serve` processes on one database (the rate limits
//! are one budget across them, leased from `rate_limits`, see `app::core::ratelimit`), and a
//! PostgreSQL restart under load.
mod common;

use std::time::{Duration, Instant};

use futures::StreamExt;
use serde_json::json;

use common::*;

/// 300 calls with one key (limit 100 a minute) and 30 wrong log-ins for one e-mail (limit 10 a
/// minute), spread over two processes, 32 at a time: the processes together admit no more than
/// each limit, and refuse no earlier than the documented tolerance (two processes × (lease − 1)
/// = 2 calls of 100; none for log-ins). Each process on its own, as before, would have let
/// about twice the limit through.
#[tokio::test]
async fn rate_limits_hold_across_two_processes() {
    let (name, url) = fresh_database().await;
    let env = [("ENGRAM_RATE_API_PER_MIN", "100")];
    let (one, base_one) = start_serve(&url, &["--no-worker"], &env).await;
    let (two, base_two) = start_serve(&url, &["--no-worker"], &env).await;
    let http = client();
    let key = account_key(&http, &base_one, "limits@example.com").await;

    let bases = [base_one.clone(), base_two.clone()];
    let calls: Vec<(usize, u16, Option<u64>)> = futures::stream::iter(0..300usize)
        .map(|i| {
            let (http, key, base) = (http.clone(), key.clone(), bases[i % 2].clone());
            async move {
                let r = http
                    .get(format!("{base}/api/v1/projects"))
                    .header("x-api-key", key)
                    .send()
                    .await
                    .unwrap();
                let retry = r
                    .headers()
                    .get("retry-after")
                    .and_then(|v| v.to_str().ok()?.parse().ok());
                (i % 2, r.status().as_u16(), retry)
            }
        })
        .buffer_unordered(32)
        .collect()
        .await;
    let admitted = |process: usize| {
        calls
            .iter()
            .filter(|(p, s, _)| *p == process && *s == 200)
            .count()
    };
    let (by_one, by_two) = (admitted(0), admitted(1));
    let refused: Vec<_> = calls.iter().filter(|(_, s, _)| *s == 429).collect();
    println!(
        "limit 100 over two processes: {by_one} + {by_two} admitted, {} refused",
        refused.len()
    );
    assert!(
        (98..=100).contains(&(by_one + by_two)),
        "admitted {by_one} + {by_two}"
    );
    assert!(by_one > 0 && by_two > 0, "both processes served some");
    assert_eq!(by_one + by_two + refused.len(), 300, "only 200 or 429");
    assert!(
        refused
            .iter()
            .all(|(_, _, retry)| retry.is_some_and(|r| (1..=60).contains(&r))),
        "every 429 says when to retry"
    );

    // Log-ins: a lease of one hit, so exactly 10 log-ins are checked, whichever process: the
    // right one `account_key` made and 9 of the wrong ones.
    let attempts: Vec<u16> = futures::stream::iter(0..30usize)
        .map(|i| {
            let (http, base) = (http.clone(), bases[i % 2].clone());
            async move {
                http.post(format!("{base}/api/auth/login"))
                    .form(&[
                        ("username", "limits@example.com"),
                        ("password", "wrong-one"),
                    ])
                    .send()
                    .await
                    .unwrap()
                    .status()
                    .as_u16()
            }
        })
        .buffer_unordered(8)
        .collect()
        .await;
    let checked = attempts.iter().filter(|&&s| s == 401).count();
    let limited = attempts.iter().filter(|&&s| s == 429).count();
    assert_eq!((checked, limited), (9, 21), "{attempts:?}");

    // Another key has its own budget, in both processes.
    let other = account_key(&http, &base_two, "other@example.com").await;
    for base in &bases {
        let r = http
            .get(format!("{base}/api/v1/projects"))
            .header("x-api-key", &other)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
    }
    drop(one);
    drop(two);
    drop_database(&name).await;
}

/// A PostgreSQL cluster of the test's own (initdb into a temporary directory, its own port),
/// so stopping it disturbs no other test. Run as the `postgres` user when the tests run as root
/// (initdb refuses root). The binaries are Debian's PostgreSQL 15 (pgvector is installed for it).
struct Cluster {
    dir: std::path::PathBuf,
    port: u16,
    bin: std::path::PathBuf,
}

impl Cluster {
    /// A PostgreSQL tool, run as `postgres` when the tests run as root.
    fn command(&self, tool: &str) -> std::process::Command {
        let tool = self.bin.join(tool);
        if unsafe { libc_geteuid() } == 0 {
            let mut c = std::process::Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(tool);
            c
        } else {
            std::process::Command::new(tool)
        }
    }

    fn pg(&self, tool: &str, args: &[&str]) -> std::process::Output {
        let out = self.command(tool).args(args).output().unwrap();
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        out
    }

    fn init() -> Self {
        let bin = std::path::PathBuf::from("/usr/lib/postgresql/15/bin");
        let dir = std::env::temp_dir().join(format!("engram-pg-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).unwrap();
        if unsafe { libc_geteuid() } == 0 {
            let ok = std::process::Command::new("chown")
                .args(["postgres:postgres", dir.to_str().unwrap()])
                .status()
                .unwrap();
            assert!(ok.success());
        }
        let cluster = Self {
            dir,
            port: free_port(),
            bin,
        };
        let data = cluster.data();
        cluster.pg(
            "initdb",
            &[
                "-D",
                &data,
                "-A",
                "trust",
                "-U",
                "postgres",
                "--no-sync",
                "-E",
                "UTF8",
            ],
        );
        cluster.start();
        cluster
    }

    fn data(&self) -> String {
        self.dir.join("data").to_string_lossy().into_owned()
    }

    fn start(&self) {
        let options = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=100",
            self.port,
            self.dir.to_string_lossy()
        );
        let log = self.dir.join("log").to_string_lossy().into_owned();
        self.pg(
            "pg_ctl",
            &[
                "-D",
                &self.data(),
                "-o",
                &options,
                "-l",
                &log,
                "-w",
                "start",
            ],
        );
    }

    /// A fast shutdown, as `systemctl restart` does: sessions are terminated, a checkpoint
    /// written.
    fn stop(&self) {
        self.pg("pg_ctl", &["-D", &self.data(), "-m", "fast", "-w", "stop"]);
    }

    fn url(&self, db: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{db}", self.port)
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = self
            .command("pg_ctl")
            .args(["-D", &self.data(), "-m", "immediate", "stop"])
            .output();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

extern "C" {
    #[link_name = "geteuid"]
    fn libc_geteuid() -> u32;
}

/// One request of the load: its kind, status, `Retry-After`, how long it took, and the task
/// acknowledged (writes).
#[derive(Debug)]
struct Sent {
    write: bool,
    status: u16,
    retry_after: bool,
    took: Duration,
    at: Instant,
    task: Option<String>,
}

/// PostgreSQL restarts (fast shutdown, 6 s down) while 4 clients post memories and 4 search:
/// during the outage every request answers 503 with `Retry-After`, within the connection
/// timeout (3 s) and 1.5 s (requests queued one after another behind a failing lookup took the
/// whole outage, 6 s), never 500; the service answers again by itself once the
/// database is back; every acknowledged task exists and completes exactly once (one memory per
/// task, no job left behind); the worker goes on with new work.
#[tokio::test]
async fn a_database_restart_under_load_is_503_then_recovers_and_loses_no_task() {
    let cluster = Cluster::init();
    let mut admin = <sqlx::PgConnection as sqlx::Connection>::connect(&cluster.url("postgres"))
        .await
        .unwrap();
    sqlx::query("create database engram")
        .execute(&mut admin)
        .await
        .unwrap();
    drop(admin);
    let url = cluster.url("engram");
    // As setup does for the shared server: these extensions need a superuser.
    let mut db = <sqlx::PgConnection as sqlx::Connection>::connect(&url)
        .await
        .unwrap();
    sqlx::raw_sql("create extension vector; create extension hstore;")
        .execute(&mut db)
        .await
        .unwrap();
    drop(db);
    let (_serve, base) = start_serve(
        &url,
        &[],
        &[
            ("ENGRAM_WORKER_HEARTBEAT_SECS", "2"),
            ("ENGRAM_RATE_API_PER_MIN", "100000"),
        ],
    )
    .await;
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(20))
        .build()
        .unwrap();
    let key = account_key(&http, &base, "restart@example.com").await;

    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let clients: Vec<_> = (0..8)
        .map(|c| {
            let (http, base, key, stop) = (http.clone(), base.clone(), key.clone(), stop.clone());
            tokio::spawn(async move {
                let write = c % 2 == 0;
                let mut sent = vec![];
                let mut i = 0;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    i += 1;
                    let req = if write {
                        http.post(format!("{base}/api/v1/memories")).json(&json!({
                            "content": format!("Client {c} wrote note {i} about the harbour ferry timetable")
                        }))
                    } else {
                        http.post(format!("{base}/api/v1/memories/search"))
                            .json(&json!({"query": "ferry timetable", "limit": 5}))
                    };
                    let at = Instant::now();
                    let r = req.header("x-api-key", &key).send().await;
                    let took = at.elapsed();
                    let (status, retry_after, task) = match r {
                        Ok(r) => {
                            let status = r.status().as_u16();
                            let retry = r.headers().contains_key("retry-after");
                            let body: serde_json::Value = r.json().await.unwrap_or_default();
                            let task = body["task_id"].as_str().map(String::from);
                            (status, retry, task)
                        }
                        // No answer at all (a hang past the client's 20 s, a reset).
                        Err(_) => (0, false, None),
                    };
                    sent.push(Sent { write, status, retry_after, took, at, task });
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                sent
            })
        })
        .collect();

    tokio::time::sleep(Duration::from_secs(3)).await;
    let down = Instant::now();
    cluster.stop();
    tokio::time::sleep(Duration::from_secs(6)).await;
    cluster.start();
    let up = Instant::now();
    tokio::time::sleep(Duration::from_secs(8)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut sent = vec![];
    for c in clients {
        sent.extend(c.await.unwrap());
    }

    let count = |f: &dyn Fn(&Sent) -> bool| sent.iter().filter(|s| f(s)).count();
    let unavailable = count(&|s| s.status == 503);
    println!(
        "{} requests: {} answered 200, {unavailable} answered 503; slowest {:?}",
        sent.len(),
        count(&|s| s.status == 200),
        sent.iter().map(|s| s.took).max().unwrap()
    );
    let odd: Vec<_> = sent
        .iter()
        .filter(|s| s.status != 200 && s.status != 503)
        .collect();
    assert!(
        odd.is_empty(),
        "only 200 or 503: {} others, such as {:?}",
        odd.len(),
        &odd[..odd.len().min(3)]
    );
    assert!(unavailable > 0, "the outage was seen");
    assert!(
        sent.iter()
            .filter(|s| s.status == 503)
            .all(|s| s.retry_after),
        "every 503 says when to retry"
    );
    let slow: Vec<_> = sent
        .iter()
        .filter(|s| s.took > app::core::state::CONNECT_TIMEOUT + Duration::from_millis(1500))
        .collect();
    assert!(
        slow.is_empty(),
        "no request waits past the connect timeout: {slow:?}"
    );
    // Served again by itself: both kinds answer 200 after the restart, and the last second of
    // load saw nothing else.
    for write in [true, false] {
        let after: Vec<_> = sent
            .iter()
            .filter(|s| s.write == write && s.at > up)
            .collect();
        assert!(
            after.iter().any(|s| s.status == 200),
            "recovered (write {write})"
        );
        let last = after
            .iter()
            .rev()
            .take_while(|s| s.at > up + Duration::from_secs(6));
        assert!(
            last.clone().all(|s| s.status == 200),
            "stable again: {:?}",
            last.collect::<Vec<_>>()
        );
    }
    assert!(sent
        .iter()
        .any(|s| s.at > down && s.at < up && s.status == 503));

    // Every acknowledged task completes, exactly once.
    let acked: Vec<String> = sent.iter().filter_map(|s| s.task.clone()).collect();
    assert!(acked.len() > 20, "{} acknowledged", acked.len());
    let pool = server::connect(&url).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let done: i64 = sqlx::query_scalar(
            "select count(*) from tasks where id = any($1::uuid[]) and status = 'completed'",
        )
        .bind(&acked)
        .fetch_one(&pool)
        .await
        .unwrap();
        if done as usize == acked.len() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{done} of {} acknowledged tasks completed",
            acked.len()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let (memories, distinct, matching): (i64, i64, i64) = sqlx::query_as(
        "select count(*), count(distinct m.task_id), count(*) filter (where t.memory_id = m.id)
         from memories m join tasks t on t.id = m.task_id where t.id = any($1::uuid[])",
    )
    .bind(&acked)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(
        (memories, distinct, matching),
        (acked.len() as i64, acked.len() as i64, acked.len() as i64),
        "one memory per acknowledged task, the one the task names"
    );
    let left: i64 = sqlx::query_scalar(
        "select count(*) from apalis.jobs where status in ('Pending', 'Queued', 'Running')",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(left, 0, "no job left behind");

    // The worker takes new work.
    let (s, b) = body(
        http.post(format!("{base}/api/v1/memories"))
            .header("x-api-key", &key)
            .json(&json!({"content": "Written after the restart"}))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(s, 200, "{b}");
    let task = b["task_id"].as_str().unwrap().to_string();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let status: String = sqlx::query_scalar("select status from tasks where id = $1::uuid")
            .bind(&task)
            .fetch_one(&pool)
            .await
            .unwrap();
        if status == "completed" {
            break;
        }
        assert!(Instant::now() < deadline, "new task still {status}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    pool.close().await;
}
