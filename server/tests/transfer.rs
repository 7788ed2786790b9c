//! Export and import: an account exported from one database and imported into a fresh account
//! on another keeps every field; a bad file imports nothing; an export holds its account only;
//! `engram export` writes what the API streams.
mod common;

use common::*;
use serde_json::{json, Value};

type MemoryFields = (
    String,
    String,
    Option<Value>,
    Option<String>,
    String,
    f32,
    String,
    String,
    String,
    String,
    String,
);

/// Every exported field of the account's memories, in the order they were stored (ids of the account left out,
/// the conversation named by its title instead of its id).
async fn memories_of(app: &TestApp, email: &str) -> Vec<MemoryFields> {
    sqlx::query_as(
        "select p.name, m.content,
                m.metadata - 'conversation_id' - 'message_id'
                    || case when c.title is null then '{}'::jsonb else jsonb_build_object('conversation', c.title) end,
                m.agent_id, m.cognitive_sector, m.importance_score,
                m.created_at::text, m.updated_at::text, m.event_day::text, m.embedding_model, m.embedding::text
         from memories m join users u on u.id = m.user_id
         join projects p on p.user_id = m.user_id and p.id = m.project_id
         left join conversations c on c.id::text = m.metadata ->> 'conversation_id' and c.user_id = m.user_id
         where u.email = $1 order by m.created_at, m.seq",
    )
    .bind(email)
    .fetch_all(&app.pool)
    .await
    .unwrap()
}

async fn messages_of(
    app: &TestApp,
    email: &str,
) -> Vec<(
    String,
    Option<String>,
    i32,
    String,
    String,
    Option<String>,
    Option<i32>,
    Option<String>,
)> {
    sqlx::query_as(
        "select c.title, c.external_id, m.position, m.role, m.content, m.name, m.tokens, m.sent_at::text
         from conversation_messages m join conversations c on c.id = m.conversation_id
         join users u on u.id = c.user_id where u.email = $1 order by c.created_at, m.position",
    )
    .bind(email)
    .fetch_all(&app.pool)
    .await
    .unwrap()
}

async fn export(app: &TestApp, key: &str) -> String {
    let r = app
        .http
        .get(app.url("/api/v1/export"))
        .header("x-api-key", key)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["content-type"], "application/x-ndjson");
    r.text().await.unwrap()
}

async fn import(app: &TestApp, key: &str, body: String) -> (reqwest::StatusCode, Value) {
    body_of(
        app.http
            .post(app.url("/api/v1/import"))
            .header("x-api-key", key)
            .header("content-type", "application/x-ndjson")
            .body(body)
            .send()
            .await
            .unwrap(),
    )
    .await
}

async fn body_of(r: reqwest::Response) -> (reqwest::StatusCode, Value) {
    body(r).await
}

#[tokio::test]
async fn an_account_moves_to_another_database_with_every_field() {
    let source = spawn_worker_app().await;
    let (_, key) = source.user("source@example.com").await;
    let (s, garden) = source
        .post_json(
            "/api/v1/projects",
            &json!({"name": "garden", "description": "Plants and soil"}),
            Some(&key),
        )
        .await;
    assert_eq!(s, 200, "{garden}");
    source
        .store_all(
            &key,
            vec![
                json!({"content": "The tomatoes need watering every second day.", "project_id": "garden", "metadata": {"tags": ["plants"]}, "agent_id": "gardener"}),
                json!({"content": "My passport expires in March 2027.", "metadata": {"date": "2026-11-01"}}),
            ],
        )
        .await;
    let (_, conv) = source
        .post_json(
            "/api/v1/conversations",
            &json!({"title": "Compost", "project_id": "garden"}),
            Some(&key),
        )
        .await;
    let conv_id = conv["data"]["id"].as_str().unwrap();
    let (s, appended) = source
        .post_json(
            &format!("/api/v1/conversations/{conv_id}/messages"),
            &json!({"messages": [
                {"role": "system", "content": "You are a gardening assistant."},
                {"role": "user", "content": "How often should I turn the compost?", "timestamp": "2026-11-20T08:00:00Z", "tokens": 9},
                {"role": "assistant", "content": "Every week or two, and keep it moist.", "name": "helper"}
            ]}),
            Some(&key),
        )
        .await;
    assert_eq!(s, 200, "{appended}");
    for t in appended["task_ids"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
    {
        assert_eq!(source.wait_task(&key, t).await["status"], "completed");
    }
    // Another account's memory never appears in this export.
    let (_, other) = source.user("other@example.com").await;
    source
        .store_all(&other, vec![json!({"content": "Someone else's secret"})])
        .await;

    let exported = export(&source, &key).await;
    let lines: Vec<Value> = exported
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines[0]["type"], "header");
    let kinds = |k: &str| lines.iter().filter(|l| l["type"] == k).count();
    assert_eq!(
        (kinds("project"), kinds("conversation"), kinds("memory")),
        (2, 1, 4)
    );
    assert!(!exported.contains("Someone else's secret"));

    // The command line writes the same records.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_engram"))
        .args(["export", "source@example.com"])
        .env("DATABASE_URL", &source.db_url)
        .env("ENGRAM_MODEL_DIR", app::core::embed::default_model_dir())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let cli = String::from_utf8(out.stdout).unwrap();
    assert_eq!(
        cli.lines().skip(1).collect::<Vec<_>>(),
        exported.lines().skip(1).collect::<Vec<_>>()
    );

    // Into a fresh account on another database.
    let target = spawn_app().await;
    let (_, target_key) = target.user("target@example.com").await;
    let (s, report) = import(&target, &target_key, exported.clone()).await;
    assert_eq!(s, 200, "{report}");
    assert_eq!(
        report["data"],
        json!({"projects_created": 1, "projects_matched": 1, "conversations": 1, "messages": 3,
               "memories_kept": 4, "memories_queued": 0})
    );
    let before = memories_of(&source, "source@example.com").await;
    let after = memories_of(&target, "target@example.com").await;
    assert_eq!(before.len(), 4);
    assert_eq!(before, after);
    assert_eq!(
        messages_of(&source, "source@example.com").await,
        messages_of(&target, "target@example.com").await
    );
    let (_, projects) = target.get("/api/v1/projects", Some(&target_key)).await;
    let garden = projects["data"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "garden")
        .unwrap()
        .clone();
    assert_eq!(garden["description"], "Plants and soil");
    assert_eq!(garden["memory_count"], 3);
    // The conversation's memories name the imported conversation: one stream again.
    let streams: i64 = sqlx::query_scalar(
        "select count(distinct stream) from memories where metadata ? 'conversation_id'",
    )
    .fetch_one(&target.pool)
    .await
    .unwrap();
    assert_eq!(streams, 1);
    let (_, found) = target
        .post_json(
            "/api/v1/memories/search",
            &json!({"query": "turning compost"}),
            Some(&target_key),
        )
        .await;
    assert!(
        found["data"][0]["content"]
            .as_str()
            .unwrap()
            .contains("compost"),
        "{found}"
    );
}

#[tokio::test]
async fn a_bad_file_imports_nothing_and_other_models_are_queued() {
    let app = spawn_worker_app().await;
    let (_, key) = app.user("importer@example.com").await;
    let project = r#"{"type":"project","id":"p1","name":"notes","description":null,"created_at":"2026-11-01T00:00:00Z"}"#;
    let memory = |content: &str, model: &str| {
        json!({"type": "memory", "id": "00000000-0000-0000-0000-000000000001", "project_id": "p1",
               "content": content, "metadata": {}, "agent_id": null, "cognitive_sector": "semantic",
               "importance_score": 0.5, "created_at": "2026-11-01T00:00:00Z", "updated_at": "2026-11-01T00:00:00Z",
               "event_day": "2026-11-01", "embedding_model": model, "embedding": [0.1, 0.2]})
        .to_string()
    };
    // A good line, then a bad one: nothing lands.
    let (s, b) = import(
        &app,
        &key,
        format!("{project}\n{}\nnot json\n", memory("kept?", "other-model")),
    )
    .await;
    assert_eq!(s, 422, "{b}");
    assert_eq!(b["detail"][0]["ctx"]["line"], 3, "{b}");
    let (_, projects) = app.get("/api/v1/projects", Some(&key)).await;
    assert_eq!(
        projects["data"].as_array().unwrap().len(),
        1,
        "the project was not created either"
    );
    // A memory before its project, an unknown version: refused.
    let (s, _) = import(&app, &key, memory("orphan", "other-model")).await;
    assert_eq!(s, 422);
    let (s, _) = import(
        &app,
        &key,
        r#"{"type":"header","version":99,"exported_at":"2026-11-01T00:00:00Z","email":null}"#
            .into(),
    )
    .await;
    assert_eq!(s, 422);
    let (s, _) = import(&app, &key, String::new()).await;
    assert_eq!(s, 200);

    // Another model's vectors are not kept: the memory goes through the pipeline.
    let (s, b) = import(
        &app,
        &key,
        format!(
            "{project}\n{}\n",
            memory("Queued because another model embedded it", "other-model")
        ),
    )
    .await;
    assert_eq!(s, 200, "{b}");
    assert_eq!(b["data"]["memories_queued"], 1);
    let task: String = sqlx::query_scalar("select id::text from tasks")
        .fetch_one(&app.pool)
        .await
        .unwrap();
    assert_eq!(app.wait_task(&key, &task).await["status"], "completed");
    let model: String = sqlx::query_scalar("select embedding_model from memories")
        .fetch_one(&app.pool)
        .await
        .unwrap();
    assert_eq!(model, "all-MiniLM-L6-v2");
    let (s, _) = import(&app, &key, String::new()).await;
    assert_eq!(s, 200);
    // The same conversation (a client id) imported twice: one conversation, and the second
    // import's memory joins it.
    let conversation = r#"{"type":"conversation","id":"00000000-0000-0000-0000-0000000000c1","project_id":"p1","title":"t","external_id":"c-1","created_at":"2026-11-01T00:00:00Z","updated_at":"2026-11-01T00:00:00Z","messages":[{"id":"00000000-0000-0000-0000-0000000000d1","role":"user","content":"hi","name":null,"tokens":null,"sent_at":null,"created_at":"2026-11-01T00:00:00Z"}]}"#;
    let mut joined: Value =
        serde_json::from_str(&memory("In the conversation", "other-model")).unwrap();
    joined["metadata"] = json!({"conversation_id": "00000000-0000-0000-0000-0000000000c1"});
    for _ in 0..2 {
        let (s, b) = import(&app, &key, format!("{project}\n{conversation}\n{joined}\n")).await;
        assert_eq!(s, 200, "{b}");
    }
    let (_, convs) = app.get("/api/v1/conversations", Some(&key)).await;
    assert_eq!(convs["total"], 1, "{convs}");
    assert_eq!(convs["data"][0]["message_count"], 1);
    let named: Vec<String> = sqlx::query_scalar(
        "select metadata ->> 'conversation_id' from tasks where content = 'In the conversation'",
    )
    .fetch_all(&app.pool)
    .await
    .unwrap();
    let id = convs["data"][0]["id"].as_str().unwrap().to_string();
    assert_eq!(named, vec![id.clone(), id]);

    let r = app
        .http
        .post(app.url("/api/v1/import"))
        .body("")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
}
