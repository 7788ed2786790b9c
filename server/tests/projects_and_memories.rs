//! Projects, memories and tasks through the real router, PostgreSQL and an apalis worker.
mod common;

use common::*;
use serde_json::json;

#[tokio::test]
async fn projects_are_created_named_and_deleted_per_account() {
    let app = spawn_app().await;
    let (_, key) = app.user("pat@example.com").await;
    let (_, other) = app.user("quinn@example.com").await;

    let (s, b) = app
        .post_json(
            "/api/v1/projects",
            &json!({"name": "support-bot", "description": "tickets"}),
            Some(&key),
        )
        .await;
    assert_eq!(s, 200, "{b}");
    let id = b["data"]["id"].as_str().unwrap().to_string();
    assert_eq!(b["data"]["name"], "support-bot");
    assert_eq!(b["data"]["description"], "tickets");
    assert!(b["data"]["created_at"].as_str().unwrap().ends_with('Z'));

    let (s, _) = app
        .post_json(
            "/api/v1/projects",
            &json!({"name": "support-bot"}),
            Some(&key),
        )
        .await;
    assert_eq!(s, 409);
    // Names are per account.
    assert_eq!(
        app.post_json(
            "/api/v1/projects",
            &json!({"name": "support-bot"}),
            Some(&other)
        )
        .await
        .0,
        200
    );

    let (s, b) = app.get(&format!("/api/v1/projects/{id}"), Some(&key)).await;
    assert_eq!(
        (s, b["data"]["id"].as_str()),
        (200.try_into().unwrap(), Some(id.as_str()))
    );
    let (s, b) = app.get("/api/v1/projects/support-bot", Some(&key)).await;
    assert_eq!(s, 200, "by name: {b}");
    assert_eq!(b["data"]["id"], id.as_str());
    assert_eq!(
        app.get(&format!("/api/v1/projects/{id}"), Some(&other))
            .await
            .0,
        404
    );
    assert_eq!(
        app.delete(&format!("/api/v1/projects/{id}"), Some(&other))
            .await
            .0,
        404
    );

    let (s, b) = app.delete("/api/v1/projects/default", Some(&key)).await;
    assert_eq!(s, 409, "{b}");

    let (s, b) = app
        .post_json("/api/v1/projects", &json!({"name": ""}), Some(&key))
        .await;
    assert_validation(s, &b, &["body", "name"]);
    let (s, b) = app
        .post_json(
            "/api/v1/projects",
            &json!({"name": "x".repeat(65)}),
            Some(&key),
        )
        .await;
    assert_validation(s, &b, &["body", "name"]);
    let (s, b) = app
        .post_json(
            "/api/v1/projects",
            &json!({"name": "ok", "description": "d".repeat(1001)}),
            Some(&key),
        )
        .await;
    assert_validation(s, &b, &["body", "description"]);

    let (s, b) = app.get("/api/v1/projects", Some(&key)).await;
    assert_eq!(s, 200);
    let names: Vec<&str> = b["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, vec!["default", "support-bot"]);
}

#[tokio::test]
async fn a_memory_goes_from_pending_to_completed_with_every_field() {
    let app = spawn_worker_app().await;
    let (_, key) = app.user("rae@example.com").await;
    let (s, b) = app.post_json("/api/v1/memories", &json!({"content": "  Remember: Sam is allergic to peanuts  ", "metadata": {"source": "chat"}, "agent_id": "agent-7"}), Some(&key)).await;
    assert_eq!(s, 200, "{b}");
    assert_eq!(b["success"], true);
    assert_eq!(b["status"], "pending");
    assert!(b["message"].is_string());
    let task_id = b["task_id"].as_str().unwrap();

    let task = app.wait_task(&key, task_id).await;
    assert_eq!(task["status"], "completed", "{task}");
    assert_eq!(task["task_id"], task_id);
    let sector = task["cognitive_sector"].as_str().unwrap();
    assert!([
        "episodic",
        "semantic",
        "procedural",
        "emotional",
        "reflective"
    ]
    .contains(&sector));
    let importance = task["importance_score"].as_f64().unwrap();
    assert!((0.0..=1.0).contains(&importance));
    assert!(task["completed_at"].as_str().unwrap().ends_with('Z'));
    assert!(task["error"].is_null());

    let memory_id = task["memory_id"].as_str().unwrap();
    let (s, m) = app
        .get(&format!("/api/v1/memories/{memory_id}"), Some(&key))
        .await;
    assert_eq!(s, 200, "{m}");
    let m = &m["data"];
    assert_eq!(m["content"], "Remember: Sam is allergic to peanuts");
    assert_eq!(m["project_id"], "default");
    assert_eq!(m["metadata"], json!({"source": "chat"}));
    assert_eq!(m["agent_id"], "agent-7");
    assert_eq!(m["cognitive_sector"], sector);
    for field in ["id", "created_at", "updated_at", "importance_score"] {
        assert!(!m[field].is_null(), "{field}");
    }
    // The vector is stored with its model's name.
    let model: String =
        sqlx::query_scalar("select embedding_model from memories where id = $1::uuid")
            .bind(memory_id)
            .fetch_one(&app.pool)
            .await
            .unwrap();
    assert_eq!(model, "all-MiniLM-L6-v2");
}

#[tokio::test]
async fn metadata_defaults_to_an_empty_object_and_keeps_an_explicit_null() {
    let app = spawn_worker_app().await;
    let (_, key) = app.user("sid@example.com").await;
    let ids = app
        .store_all(
            &key,
            vec![
                json!({"content": "no metadata here"}),
                json!({"content": "null metadata here", "metadata": null}),
            ],
        )
        .await;
    let (_, a) = app
        .get(&format!("/api/v1/memories/{}", ids[0]), Some(&key))
        .await;
    let (_, b) = app
        .get(&format!("/api/v1/memories/{}", ids[1]), Some(&key))
        .await;
    assert_eq!(a["data"]["metadata"], json!({}));
    assert!(a["data"]["agent_id"].is_null());
    assert!(b["data"]["metadata"].is_null());
    assert!(b["data"].as_object().unwrap().contains_key("metadata"));
}

#[tokio::test]
async fn memory_input_is_validated_and_nothing_is_queued_for_bad_input() {
    let app = spawn_app().await;
    let (_, key) = app.user("tom@example.com").await;
    let cases = vec![
        (json!({}), "content"),
        (json!({"content": "   "}), "content"),
        (json!({"content": 12}), "content"),
        (json!({"content": "x".repeat(32_769)}), "content"),
        (json!({"content": "ok", "metadata": [1, 2]}), "metadata"),
        (
            json!({"content": "ok", "metadata": {"big": "y".repeat(17_000)}}),
            "metadata",
        ),
        (
            json!({"content": "ok", "agent_id": "a".repeat(129)}),
            "agent_id",
        ),
    ];
    for (payload, field) in cases {
        let (s, b) = app
            .post_json("/api/v1/memories", &payload, Some(&key))
            .await;
        assert_validation(s, &b, &["body", field]);
    }
    let (s, _) = app
        .post_json(
            "/api/v1/memories",
            &json!({"content": "ok", "project_id": "nope"}),
            Some(&key),
        )
        .await;
    assert_eq!(s, 404);
    let tasks: i64 = sqlx::query_scalar("select count(*) from tasks")
        .fetch_one(&app.pool)
        .await
        .unwrap();
    let jobs: i64 = sqlx::query_scalar("select count(*) from apalis.jobs")
        .fetch_one(&app.pool)
        .await
        .unwrap();
    assert_eq!((tasks, jobs), (0, 0));
}

#[tokio::test]
async fn the_task_and_its_queue_job_are_written_together_before_the_answer() {
    // No worker runs: the acknowledged task must already be durable, with its job queued.
    let app = spawn_app().await;
    let (_, key) = app.user("uma@example.com").await;
    let task_id = app
        .remember(&key, json!({"content": "queued while no worker runs"}))
        .await;
    let (s, b) = app
        .get(&format!("/api/v1/tasks/{task_id}"), Some(&key))
        .await;
    assert_eq!(s, 200);
    assert_eq!(b["data"]["status"], "pending");
    assert!(
        b["data"]["memory_id"].is_null()
            && b["data"]["completed_at"].is_null()
            && b["data"]["error"].is_null()
    );
    let job: serde_json::Value = sqlx::query_scalar(
        "select convert_from(job, 'UTF8')::jsonb from apalis.jobs where job_type = $1",
    )
    .bind(app::core::memories::QUEUE)
    .fetch_one(&app.pool)
    .await
    .unwrap();
    assert_eq!(job["task_id"], task_id.as_str());

    // A worker started later finds it.
    start_worker(&app.state, Default::default());
    assert_eq!(app.wait_task(&key, &task_id).await["status"], "completed");
}

#[tokio::test]
async fn lists_are_newest_first_paged_filtered_and_counted() {
    let app = spawn_worker_app().await;
    let (_, key) = app.user("val@example.com").await;
    app.post_json("/api/v1/projects", &json!({"name": "work"}), Some(&key))
        .await;
    let mut payloads = vec![];
    for i in 0..5 {
        payloads.push(json!({"content": format!("default memory number {i}")}));
    }
    for i in 0..3 {
        payloads.push(json!({"content": format!("work memory number {i}"), "project_id": "work"}));
    }
    app.store_all(&key, payloads).await;

    let (s, all) = app.get("/api/v1/memories", Some(&key)).await;
    assert_eq!(s, 200);
    assert_eq!(all["total"], 8);
    let times: Vec<&str> = all["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["created_at"].as_str().unwrap())
        .collect();
    let mut sorted = times.clone();
    sorted.sort_by(|a, b| b.cmp(a));
    assert_eq!(times, sorted);

    let (_, work) = app
        .get("/api/v1/memories?project_id=work&limit=2", Some(&key))
        .await;
    assert_eq!(work["total"], 3);
    assert_eq!(work["data"].as_array().unwrap().len(), 2);
    let (_, page2) = app
        .get(
            "/api/v1/memories?project_id=work&limit=2&offset=2",
            Some(&key),
        )
        .await;
    assert_eq!(page2["data"].as_array().unwrap().len(), 1);
    assert!(work["data"]
        .as_array()
        .unwrap()
        .iter()
        .chain(page2["data"].as_array().unwrap())
        .all(|m| m["project_id"] != "default"));

    for (q, field) in [
        ("limit=0", "limit"),
        ("limit=1001", "limit"),
        ("limit=abc", "limit"),
        ("offset=-1", "offset"),
    ] {
        let (s, b) = app.get(&format!("/api/v1/memories?{q}"), Some(&key)).await;
        assert_validation(s, &b, &["query", field]);
    }
    assert_eq!(
        app.get("/api/v1/memories?project_id=nope", Some(&key))
            .await
            .0,
        404
    );
}

#[tokio::test]
async fn another_accounts_memories_tasks_and_projects_are_invisible() {
    let app = spawn_worker_app().await;
    let (_, owner) = app.user("wes@example.com").await;
    let (_, stranger) = app.user("xia@example.com").await;
    let task = app
        .remember(&owner, json!({"content": "the vault code is 4412"}))
        .await;
    let memory = app.wait_task(&owner, &task).await["memory_id"]
        .as_str()
        .unwrap()
        .to_string();

    assert_eq!(
        app.get(&format!("/api/v1/memories/{memory}"), Some(&stranger))
            .await
            .0,
        404
    );
    assert_eq!(
        app.delete(&format!("/api/v1/memories/{memory}"), Some(&stranger))
            .await
            .0,
        404
    );
    assert_eq!(
        app.get(&format!("/api/v1/tasks/{task}"), Some(&stranger))
            .await
            .0,
        404
    );
    let (_, list) = app.get("/api/v1/memories", Some(&stranger)).await;
    assert_eq!(list["total"], 0);
    let (_, found) = app
        .post_json(
            "/api/v1/memories/search",
            &json!({"query": "vault code"}),
            Some(&stranger),
        )
        .await;
    assert_eq!(found["data"].as_array().unwrap().len(), 0);
    // The owner still has it.
    assert_eq!(
        app.get(&format!("/api/v1/memories/{memory}"), Some(&owner))
            .await
            .0,
        200
    );
    assert_eq!(
        app.get("/api/v1/memories/not-a-uuid", Some(&owner)).await.0,
        404
    );
    assert_eq!(
        app.get("/api/v1/tasks/not-a-uuid", Some(&owner)).await.0,
        404
    );
}

#[tokio::test]
async fn deleting_a_memory_and_a_project_removes_them() {
    let app = spawn_worker_app().await;
    let (_, key) = app.user("yan@example.com").await;
    let (_, p) = app
        .post_json("/api/v1/projects", &json!({"name": "scratch"}), Some(&key))
        .await;
    let pid = p["data"]["id"].as_str().unwrap().to_string();
    let ids = app
        .store_all(
            &key,
            vec![
                json!({"content": "first scratch note", "project_id": "scratch"}),
                json!({"content": "second scratch note", "project_id": pid}),
            ],
        )
        .await;
    let keep = app
        .store_all(&key, vec![json!({"content": "a default note"})])
        .await;

    let (s, b) = app
        .delete(&format!("/api/v1/memories/{}", ids[0]), Some(&key))
        .await;
    assert_eq!(s, 200, "{b}");
    assert_eq!(
        app.get(&format!("/api/v1/memories/{}", ids[0]), Some(&key))
            .await
            .0,
        404
    );
    assert_eq!(
        app.delete(&format!("/api/v1/memories/{}", ids[0]), Some(&key))
            .await
            .0,
        404
    );

    // A pending task of the project goes with it.
    let pending: uuid::Uuid = uuid::Uuid::new_v4();
    sqlx::query("insert into tasks (id, user_id, project_id, content) select $1, user_id, id, 'pending one' from projects where id = $2").bind(pending).bind(&pid).execute(&app.pool).await.unwrap();
    let (s, b) = app.delete("/api/v1/projects/scratch", Some(&key)).await;
    assert_eq!(s, 200, "{b}");
    assert_eq!(b["data"]["deleted_memories"], 1);
    assert_eq!(
        app.get(&format!("/api/v1/memories/{}", ids[1]), Some(&key))
            .await
            .0,
        404
    );
    assert_eq!(
        app.get(&format!("/api/v1/tasks/{pending}"), Some(&key))
            .await
            .0,
        404
    );
    assert_eq!(
        app.get(&format!("/api/v1/memories/{}", keep[0]), Some(&key))
            .await
            .0,
        200
    );
    assert_eq!(
        app.get(&format!("/api/v1/projects/{pid}"), Some(&key))
            .await
            .0,
        404
    );
}

#[tokio::test]
async fn a_burst_of_writes_asks_ingestion_to_yield_and_single_writes_do_not() {
    let app = spawn_app().await;
    let (_, key) = app.user("burst@example.com").await;
    let foreground = app.state.embedder.foreground();
    for i in 0..3 {
        app.remember(&key, json!({"content": format!("one at a time {i}")}))
            .await;
    }
    assert_eq!(foreground.presses(), 0, "single writes never press");

    // 64 clients at once: requests queue behind the writer's batches, and it says so.
    let burst = futures::future::join_all(
        (0..64).map(|i| app.remember(&key, json!({"content": format!("burst {i}")}))),
    )
    .await;
    assert_eq!(burst.len(), 64);
    assert!(
        foreground.presses() > 0,
        "a burst of 64 writes never pressed"
    );
    let (total,): (i64,) = sqlx::query_as("select count(*) from tasks")
        .fetch_one(&app.pool)
        .await
        .unwrap();
    assert_eq!(total, 67, "every write was stored");
}

/// The memory writer's own connection (see `EnqueueWriter::spawn`), lost to the server: the
/// batch under way when it goes fails with an error the client can retry (nothing written), and
/// the next one is written on a new connection; one lost while idle is noticed before use.
#[tokio::test]
async fn the_memory_writer_replaces_a_lost_connection() {
    let app = spawn_app().await;
    let (_, key) = app.user("wren@example.com").await;
    let writer_pid = || async {
        sqlx::query_scalar::<_, i32>(
            "select pid from pg_stat_activity where datname = current_database() and application_name = $1",
        )
        .bind(app::core::memories::WRITER_APPLICATION_NAME)
        .fetch_all(&app.pool)
        .await
        .unwrap()
    };
    let terminate = |pid: i32| {
        let pool = app.pool.clone();
        async move {
            sqlx::query("select pg_terminate_backend($1, 5000)")
                .bind(pid)
                .execute(&pool)
                .await
                .unwrap();
        }
    };
    let first = app.remember(&key, json!({"content": "first"})).await;
    let pids = writer_pid().await;
    assert_eq!(pids.len(), 1, "one writer connection: {pids:?}");

    // Lost just after use: the next write fails, with nothing written, and the one after works.
    terminate(pids[0]).await;
    let (s, b) = app
        .post_json("/api/v1/memories", &json!({"content": "lost"}), Some(&key))
        .await;
    assert!(s.is_server_error(), "{s} {b}");
    let second = app.remember(&key, json!({"content": "second"})).await;
    let pids_after = writer_pid().await;
    assert_eq!(pids_after.len(), 1, "{pids_after:?}");
    assert_ne!(pids_after[0], pids[0]);

    // Lost while idle: checked before use, replaced, and the write goes through.
    terminate(pids_after[0]).await;
    tokio::time::sleep(std::time::Duration::from_millis(1200)).await;
    let third = app.remember(&key, json!({"content": "third"})).await;

    let contents: Vec<String> =
        sqlx::query_scalar("select content from tasks order by created_at, content")
            .fetch_all(&app.pool)
            .await
            .unwrap();
    assert_eq!(contents, ["first", "second", "third"]);
    let jobs: i64 = sqlx::query_scalar("select count(*) from apalis.jobs")
        .fetch_one(&app.pool)
        .await
        .unwrap();
    assert_eq!(jobs, 3);
    for task in [first, second, third] {
        let (s, b) = app.get(&format!("/api/v1/tasks/{task}"), Some(&key)).await;
        assert_eq!(s, 200, "{b}");
    }
}

/// Cases schemathesis found (end2end/fuzz), kept: text PostgreSQL cannot store was a 500, and a
/// JSON integer written as `93.0` was refused.
#[tokio::test]
async fn nul_characters_are_refused_as_422_and_integral_floats_are_integers() {
    let app = spawn_app().await;
    let (token, key) = app.user("fuzzed@example.com").await;
    // The reproduced case: a key name with a NUL in it.
    let (s, b) = app.create_key(&token, "fuzz\u{0}name").await;
    assert_validation(s, &b, &["body", "name"]);
    assert!(
        b["detail"][0]["msg"].as_str().unwrap().contains("NUL"),
        "{b}"
    );
    for (payload, loc) in [
        (json!({"content": "a\u{0}b"}), vec!["body", "content"]),
        (
            json!({"content": "fine", "metadata": {"deep": [{"x": "nul\u{0}here"}]}}),
            vec!["body", "metadata"],
        ),
        (
            json!({"content": "fine", "metadata": {"key\u{0}": 1}}),
            vec!["body", "metadata"],
        ),
        (
            json!({"content": "fine", "agent_id": "\u{0}"}),
            vec!["body", "agent_id"],
        ),
    ] {
        let (s, b) = app
            .post_json("/api/v1/memories", &payload, Some(&key))
            .await;
        assert_validation(s, &b, &loc);
    }
    let total: i64 = sqlx::query_scalar("select count(*) from tasks")
        .fetch_one(&app.pool)
        .await
        .unwrap();
    assert_eq!(total, 0, "nothing queued");
    // A NUL that reaches a query without a field's rule (a path segment): 400, not 500.
    let (s, b) = app.get("/api/v1/projects/a%00b", Some(&key)).await;
    assert_eq!(s, 400, "{b}");
    assert_eq!(b["success"], false);
    // In a query string.
    let (s, b) = app.get("/api/v1/memories?project_id=%00", Some(&key)).await;
    assert_validation(s, &b, &["query", "project_id"]);

    // `93.0` is an integer; `93.5` is not.
    let (s, b) = app
        .post_json(
            "/api/v1/memories/search",
            &json!({"query": "anything", "limit": 93.0}),
            Some(&key),
        )
        .await;
    assert_eq!(s, 200, "{b}");
    let (s, b) = app
        .post_json(
            "/api/v1/memories/search",
            &json!({"query": "anything", "limit": 93.5}),
            Some(&key),
        )
        .await;
    assert_validation(s, &b, &["body", "limit"]);
}

/// Found by schemathesis: a batch naming a project, its items naming none, was refused because
/// each item defaulted to `default`.
#[tokio::test]
async fn a_batchs_items_without_a_project_go_to_the_batchs_project() {
    let app = spawn_app().await;
    let (_, key) = app.user("batcher@example.com").await;
    let (s, b) = app
        .post_json("/api/v1/projects", &json!({"name": "notes"}), Some(&key))
        .await;
    assert_eq!(s, 200, "{b}");
    let (s, b) = app
        .post_json(
            "/api/v1/memories/batch",
            &json!({"project_id": "notes", "memories": [{"content": "one"}, {"content": "two", "project_id": "notes"}, {"content": "three", "project_id": null}]}),
            Some(&key),
        )
        .await;
    assert_eq!(s, 200, "{b}");
    let projects: Vec<String> =
        sqlx::query_scalar("select project_id from tasks order by created_at")
            .fetch_all(&app.pool)
            .await
            .unwrap();
    assert_eq!(projects.len(), 3);
    assert!(projects.iter().all(|p| p != "default"), "{projects:?}");
    // An item naming another project is still refused, and nothing is queued.
    let (s, b) = app
        .post_json(
            "/api/v1/memories/batch",
            &json!({"project_id": "notes", "memories": [{"content": "four", "project_id": "default"}]}),
            Some(&key),
        )
        .await;
    assert_validation(s, &b, &["body", "memories"]);
    assert_eq!(
        b["detail"][0]["loc"],
        json!(["body", "memories", 0, "project_id"])
    );
}
