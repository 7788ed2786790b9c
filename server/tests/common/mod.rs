//! `spawn_app()`: the real router on port 0 against a fresh PostgreSQL database (created from
//! template1, which carries pgvector), optionally with a real apalis worker.
#![allow(dead_code)]
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use reqwest::{Response, StatusCode};
use serde_json::{json, Value};
use sqlx::{Connection, PgConnection, PgPool};

use app::core::embed::{default_model_dir, EmbedderHandle};
use app::core::ingest::IngestOptions;
use app::core::state::{AppState, Settings};

pub struct Opts {
    pub worker: bool,
    pub ingest: IngestOptions,
    pub settings: Settings,
}

impl Default for Opts {
    fn default() -> Self {
        Self {
            worker: false,
            ingest: IngestOptions {
                backoff: Duration::from_millis(50),
                ..Default::default()
            },
            settings: Settings::for_tests(),
        }
    }
}

pub struct TestApp {
    pub base: String,
    pub pool: PgPool,
    pub state: AppState,
    pub http: reqwest::Client,
    pub db_url: String,
    db_name: String,
    admin_url: String,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

pub fn admin_url() -> String {
    std::env::var("ENGRAM_TEST_ADMIN_URL")
        .unwrap_or_else(|_| "postgres://engram:engram@127.0.0.1:5432/postgres".into())
}

pub fn database_url(admin: &str, db: &str) -> String {
    let (base, _) = admin.rsplit_once('/').expect("admin URL has a database");
    format!("{base}/{db}")
}

/// A fresh, migrated database; its name and URL.
pub async fn fresh_database() -> (String, String) {
    let admin = admin_url();
    let name = format!("engram_test_{}", uuid::Uuid::new_v4().simple());
    let mut conn = PgConnection::connect(&admin)
        .await
        .expect("connecting to PostgreSQL (is it running? `make setup`)");
    sqlx::query(sqlx::AssertSqlSafe(format!("create database {name}")))
        .execute(&mut conn)
        .await
        .expect("creating the test database");
    let url = database_url(&admin, &name);
    let pool = server::connect(&url).await.unwrap();
    server::migrate(&pool)
        .await
        .expect("migrating the test database");
    pool.close().await;
    (name, url)
}

/// Drops a database made by [`fresh_database`] (connections to it are closed).
pub async fn drop_database(name: &str) {
    let mut conn = PgConnection::connect(&admin_url()).await.unwrap();
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "drop database if exists {name} with (force)"
    )))
    .execute(&mut conn)
    .await
    .unwrap();
}

pub async fn spawn_app() -> TestApp {
    spawn_with(Opts::default()).await
}

pub async fn spawn_worker_app() -> TestApp {
    spawn_with(Opts {
        worker: true,
        ..Opts::default()
    })
    .await
}

pub async fn spawn_with(opts: Opts) -> TestApp {
    let (db_name, db_url) = fresh_database().await;
    let pool = server::connect(&db_url).await.unwrap();
    let state = server::build_state(
        pool.clone(),
        opts.settings,
        EmbedderHandle::new(default_model_dir()),
        "target/site",
    );
    let app = serve(state.clone()).await;
    let mut tasks = vec![app.1];
    if opts.worker {
        tasks.push(start_worker(&state, opts.ingest));
    }
    TestApp {
        base: app.0,
        pool,
        state,
        http: client(),
        db_url,
        db_name,
        admin_url: admin_url(),
        tasks,
    }
}

pub fn client() -> reqwest::Client {
    // The process's rustls provider, as `server::build_state` installs it (a test may build a
    // client before any state).
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
}

/// A port nobody listens on now.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A real `engram serve` process on a free port against `db_url`, with these arguments after
/// `serve` and these extra environment variables; returns once `/api/ready` answers 200. The
/// process is killed when the returned guard is dropped.
pub async fn start_serve(
    db_url: &str,
    args: &[&str],
    env: &[(&str, &str)],
) -> (ServeProcess, String) {
    let port = free_port();
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_engram"));
    cmd.arg("serve")
        .args(args)
        .env("DATABASE_URL", db_url)
        .env("ENGRAM_BIND", format!("127.0.0.1:{port}"))
        .env("ENGRAM_METRICS_BIND", "off")
        .env("ENGRAM_MODEL_DIR", default_model_dir())
        .stdout(std::process::Stdio::null());
    // `ENGRAM_TEST_SERVE_LOGS=1` shows the processes' logs (with `--no-capture`).
    if std::env::var_os("ENGRAM_TEST_SERVE_LOGS").is_none() {
        cmd.stderr(std::process::Stdio::null());
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    let child = ServeProcess(cmd.spawn().unwrap());
    let base = format!("http://127.0.0.1:{port}");
    let http = client();
    for _ in 0..240 {
        if let Ok(r) = http.get(format!("{base}/api/ready")).send().await {
            if r.status() == 200 {
                return (child, base);
            }
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    panic!("engram serve never became ready");
}

/// Registers an account through `base` and returns an API key of it.
pub async fn account_key(http: &reqwest::Client, base: &str, email: &str) -> String {
    let r = http
        .post(format!("{base}/api/auth/register"))
        .json(&json!({"email": email, "password": "password123"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let (_, login) = body(
        http.post(format!("{base}/api/auth/login"))
            .form(&[("username", email), ("password", "password123")])
            .send()
            .await
            .unwrap(),
    )
    .await;
    let token = login["access_token"].as_str().unwrap();
    let (_, k) = body(
        http.post(format!("{base}/api/keys"))
            .bearer_auth(token)
            .json(&json!({"name": "limits"}))
            .send()
            .await
            .unwrap(),
    )
    .await;
    k["data"]["key"].as_str().unwrap().to_string()
}

/// A child process killed on drop (a failed assertion must not leave servers running).
pub struct ServeProcess(pub std::process::Child);

impl ServeProcess {
    pub fn kill(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for ServeProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Serves the router on a free port.
pub async fn serve(state: AppState) -> (String, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let handle = tokio::spawn(async move {
        axum::serve(
            listener,
            server::router(state).into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
        .unwrap();
    });
    (base, handle)
}

pub fn start_worker(state: &AppState, options: IngestOptions) -> tokio::task::JoinHandle<()> {
    let ctx = server::ingest_context(state, options);
    let pool = state.pool.clone();
    tokio::spawn(async move {
        server::worker::run(pool, ctx, 8, Duration::from_secs(2), std::future::pending())
            .await
            .unwrap();
    })
}

impl Drop for TestApp {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
        let (admin, name) = (self.admin_url.clone(), self.db_name.clone());
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                if let Ok(mut conn) = PgConnection::connect(&admin).await {
                    let _ = sqlx::query(sqlx::AssertSqlSafe(format!(
                        "drop database if exists {name} with (force)"
                    )))
                    .execute(&mut conn)
                    .await;
                }
            });
        })
        .join()
        .ok();
    }
}

pub async fn body(r: Response) -> (StatusCode, Value) {
    let status = r.status();
    let text = r.text().await.unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

impl TestApp {
    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.base, path)
    }

    pub async fn post_json(
        &self,
        path: &str,
        payload: &Value,
        key: Option<&str>,
    ) -> (StatusCode, Value) {
        let mut req = self.http.post(self.url(path)).json(payload);
        if let Some(k) = key {
            req = req.header("x-api-key", k);
        }
        body(req.send().await.unwrap()).await
    }

    pub async fn get(&self, path: &str, key: Option<&str>) -> (StatusCode, Value) {
        let mut req = self.http.get(self.url(path));
        if let Some(k) = key {
            req = req.header("x-api-key", k);
        }
        body(req.send().await.unwrap()).await
    }

    pub async fn delete(&self, path: &str, key: Option<&str>) -> (StatusCode, Value) {
        let mut req = self.http.delete(self.url(path));
        if let Some(k) = key {
            req = req.header("x-api-key", k);
        }
        body(req.send().await.unwrap()).await
    }

    pub async fn register(&self, email: &str, password: &str) -> (StatusCode, Value) {
        self.post_json(
            "/api/auth/register",
            &json!({"email": email, "password": password}),
            None,
        )
        .await
    }

    pub async fn login(&self, email: &str, password: &str) -> (StatusCode, Value) {
        body(
            self.http
                .post(self.url("/api/auth/login"))
                .form(&[("username", email), ("password", password)])
                .send()
                .await
                .unwrap(),
        )
        .await
    }

    /// A new human account: its bearer token.
    /// Waits until the key cache listens for key changes (it connects in the background); from
    /// then on, keys are served from the cache.
    pub async fn until_listening(&self) {
        for _ in 0..100 {
            if self.state.keys.listening() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("the key cache never started listening");
    }

    pub async fn token_for(&self, email: &str) -> String {
        let (s, b) = self.register(email, "password123").await;
        assert_eq!(s, 200, "{b}");
        let (s, b) = self.login(email, "password123").await;
        assert_eq!(s, 200, "{b}");
        b["access_token"].as_str().unwrap().to_string()
    }

    /// The user id behind a bearer token (`/api/auth/me`).
    pub async fn user_id(&self, token: &str) -> i64 {
        let (s, me) = body(
            self.http
                .get(self.url("/api/auth/me"))
                .bearer_auth(token)
                .send()
                .await
                .unwrap(),
        )
        .await;
        assert_eq!(s, 200, "{me}");
        me["id"].as_i64().unwrap()
    }

    pub async fn create_key(&self, token: &str, name: &str) -> (StatusCode, Value) {
        body(
            self.http
                .post(self.url("/api/keys"))
                .bearer_auth(token)
                .json(&json!({"name": name}))
                .send()
                .await
                .unwrap(),
        )
        .await
    }

    /// A new API key of the account behind `token`: its secret.
    pub async fn new_key(&self, token: &str, name: &str) -> String {
        let (s, b) = self.create_key(token, name).await;
        assert_eq!(s, 200, "{b}");
        b["data"]["key"].as_str().unwrap().to_string()
    }

    /// A new human account with an API key: (token, key).
    pub async fn user(&self, email: &str) -> (String, String) {
        let token = self.token_for(email).await;
        let key = self.new_key(&token, "test").await;
        (token, key)
    }

    /// Queues a memory; its task id.
    pub async fn remember(&self, key: &str, payload: Value) -> String {
        let (s, b) = self
            .post_json("/api/v1/memories", &payload, Some(key))
            .await;
        assert_eq!(s, 200, "{b}");
        b["task_id"].as_str().unwrap().to_string()
    }

    /// Polls a task until it is completed or failed.
    pub async fn wait_task(&self, key: &str, task_id: &str) -> Value {
        let start = Instant::now();
        loop {
            let (s, b) = self
                .get(&format!("/api/v1/tasks/{task_id}"), Some(key))
                .await;
            assert_eq!(s, 200, "{b}");
            let status = b["data"]["status"].as_str().unwrap().to_string();
            if status == "completed" || status == "failed" {
                return b["data"].clone();
            }
            assert!(
                start.elapsed() < Duration::from_secs(90),
                "task {task_id} still {status}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Stores memories through the API and waits for each; their memory ids.
    pub async fn store_all(&self, key: &str, payloads: Vec<Value>) -> Vec<String> {
        let mut tasks = vec![];
        for p in payloads {
            tasks.push(self.remember(key, p).await);
        }
        let mut ids = vec![];
        for t in tasks {
            let task = self.wait_task(key, &t).await;
            assert_eq!(task["status"], "completed", "{task}");
            ids.push(task["memory_id"].as_str().unwrap().to_string());
        }
        ids
    }
}

/// Asserts a FastAPI-shaped 422 naming `loc`.
pub fn assert_validation(status: StatusCode, body: &Value, loc: &[&str]) {
    assert_eq!(status, 422, "{body}");
    assert_eq!(body["success"], false);
    let errors = body["detail"]
        .as_array()
        .unwrap_or_else(|| panic!("detail is not an array: {body}"));
    // List indexes are numbers in `loc`; `loc` here names them as text ("1").
    let want: Vec<String> = loc.iter().map(|s| s.to_string()).collect();
    let text = |v: &Value| {
        v.as_str()
            .map(str::to_string)
            .unwrap_or_else(|| v.to_string())
    };
    assert!(
        errors.iter().any(|e| e["loc"]
            .as_array()
            .map(|l| l.iter().map(text).collect::<Vec<_>>().starts_with(&want))
            .unwrap_or(false)
            && e["msg"].is_string()
            && e["type"].is_string()),
        "no error at {loc:?}: {body}"
    );
}
