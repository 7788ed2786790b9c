//! The OpenAPI document against the real server: every endpoint is in it, every response the
//! handlers give (successes and errors, with a real worker) matches the schema documented for
//! its status, no response carries a field the schema does not name, and every request example
//! in the document is accepted.
mod common;

use std::collections::BTreeSet;

use reqwest::Method;
use serde_json::{json, Value};

use common::{body, spawn_worker_app, TestApp};

/// Checks responses against the document and records which operations were exercised.
struct Conformance {
    doc: Value,
    seen: BTreeSet<(String, String)>,
}

/// Makes every object schema closed (`unevaluatedProperties: false`), so a response field the
/// document does not name fails validation too.
fn close_objects(v: &mut Value) {
    match v {
        Value::Object(map) => {
            if map.contains_key("properties") && !map.contains_key("additionalProperties") {
                map.insert("unevaluatedProperties".into(), json!(false));
            }
            for child in map.values_mut() {
                close_objects(child);
            }
        }
        Value::Array(items) => items.iter_mut().for_each(close_objects),
        _ => {}
    }
}

impl Conformance {
    fn new(doc: Value) -> Self {
        Self {
            doc,
            seen: BTreeSet::new(),
        }
    }

    fn operation(&self, method: &str, template: &str) -> &Value {
        let op = &self.doc["paths"][template][method.to_lowercase()];
        assert!(
            op.is_object(),
            "{method} {template} is served but missing from /api/openapi.json"
        );
        op
    }

    /// Asserts `body`, answered with `status`, matches the schema documented for that status.
    fn check(&mut self, method: &str, template: &str, status: u16, body: &Value) {
        self.seen
            .insert((method.to_lowercase(), template.to_string()));
        if let Err(problem) = self.violations(method, template, status, body) {
            panic!("{problem}");
        }
    }

    /// Why `body`, answered with `status`, does not match the document, if it does not.
    fn violations(
        &self,
        method: &str,
        template: &str,
        status: u16,
        body: &Value,
    ) -> Result<(), String> {
        let op = self.operation(method, template);
        let response = &op["responses"][status.to_string()];
        if !response.is_object() {
            return Err(format!(
                "{method} {template} answered {status}, which the document does not list: {body}"
            ));
        }
        let mut response = response.clone();
        if let Some(r) = response.get("$ref").and_then(Value::as_str) {
            let name = r.rsplit('/').next().unwrap();
            response = self.doc["components"]["responses"][name].clone();
        }
        let Some(schema) = response
            .pointer("/content/application~1json/schema")
            .cloned()
        else {
            panic!("{method} {template} {status} has no JSON schema in the document");
        };
        let mut root = json!({"components": self.doc["components"].clone()});
        root.as_object_mut()
            .unwrap()
            .extend(schema.as_object().unwrap().clone());
        close_objects(&mut root);
        let validator = jsonschema::draft202012::new(&root)
            .unwrap_or_else(|e| panic!("{method} {template} {status}: bad schema: {e}"));
        let errors: Vec<String> = validator
            .iter_errors(body)
            .map(|e| format!("{} at {}", e, e.instance_path()))
            .collect();
        if errors.is_empty() {
            Ok(())
        } else {
            Err(format!(
                "{method} {template} {status}: the response does not match the document:\n{}\nbody: {body}",
                errors.join("\n")
            ))
        }
    }

    /// Calls `template` (path parameters filled in order from `args`) and checks the answer.
    async fn call(
        &mut self,
        app: &TestApp,
        method: Method,
        template: &str,
        args: &[&str],
        payload: Option<&Value>,
        auth: Auth<'_>,
    ) -> (u16, Value) {
        let mut path = template.to_string();
        for a in args {
            let start = path.find('{').expect("more arguments than parameters");
            let end = path[start..].find('}').unwrap() + start;
            path.replace_range(start..=end, a);
        }
        let mut req = app.http.request(method.clone(), app.url(&path));
        req = match auth {
            Auth::Anon => req,
            Auth::Key(k) => req.header("x-api-key", k),
            Auth::Bearer(t) => req.bearer_auth(t),
        };
        if let Some(p) = payload {
            req = req.json(p);
        }
        let (status, value) = body(req.send().await.unwrap()).await;
        let documented = template.split('?').next().unwrap();
        self.check(method.as_str(), documented, status.as_u16(), &value);
        (status.as_u16(), value)
    }

    /// Every operation of the document was exercised.
    fn assert_all_exercised(&self) {
        let mut missing = vec![];
        for (path, item) in self.doc["paths"].as_object().unwrap() {
            for method in item.as_object().unwrap().keys() {
                if !self.seen.contains(&(method.clone(), path.clone())) {
                    missing.push(format!("{method} {path}"));
                }
            }
        }
        assert!(
            missing.is_empty(),
            "operations never exercised: {missing:?}"
        );
    }
}

#[derive(Clone, Copy)]
enum Auth<'a> {
    Anon,
    Key(&'a str),
    Bearer(&'a str),
}

#[tokio::test]
async fn every_response_matches_the_document() {
    let app = spawn_worker_app().await;
    let (s, doc) = app.get("/api/openapi.json", None).await;
    assert_eq!(s, 200);
    assert!(
        doc["openapi"].as_str().unwrap().starts_with("3.1"),
        "{}",
        doc["openapi"]
    );
    let schemes = &doc["components"]["securitySchemes"];
    assert_eq!(schemes["api_key"]["name"], "X-API-Key", "{schemes}");
    assert_eq!(schemes["bearer"]["scheme"], "bearer", "{schemes}");
    let mut c = Conformance::new(doc);
    use Auth::*;
    use Method as M;

    // Service.
    c.call(&app, M::GET, "/api/health", &[], None, Anon).await;
    c.call(&app, M::GET, "/api/ready", &[], None, Anon).await;

    // Accounts and keys.
    let creds = json!({"email": "doc@example.com", "password": "password123"});
    assert_eq!(
        c.call(&app, M::POST, "/api/auth/register", &[], Some(&creds), Anon)
            .await
            .0,
        200
    );
    assert_eq!(
        c.call(&app, M::POST, "/api/auth/register", &[], Some(&creds), Anon)
            .await
            .0,
        409
    );
    assert_eq!(
        c.call(
            &app,
            M::POST,
            "/api/auth/register",
            &[],
            Some(&json!({"email": "x"})),
            Anon
        )
        .await
        .0,
        422
    );
    let (s, login) = body(
        app.http
            .post(app.url("/api/auth/login"))
            .form(&[("username", "doc@example.com"), ("password", "password123")])
            .send()
            .await
            .unwrap(),
    )
    .await;
    c.check("POST", "/api/auth/login", s.as_u16(), &login);
    let (s, bad) = body(
        app.http
            .post(app.url("/api/auth/login"))
            .form(&[
                ("username", "doc@example.com"),
                ("password", "wrong-password"),
            ])
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(s, 401);
    c.check("POST", "/api/auth/login", 401, &bad);
    assert_eq!(
        c.call(&app, M::POST, "/api/auth/login", &[], Some(&creds), Anon)
            .await
            .0,
        422
    );
    let token = login["access_token"].as_str().unwrap().to_string();
    assert_eq!(
        c.call(&app, M::GET, "/api/auth/me", &[], None, Bearer(&token))
            .await
            .0,
        200
    );
    assert_eq!(
        c.call(&app, M::GET, "/api/auth/me", &[], None, Anon)
            .await
            .0,
        401
    );
    let (_, created) = c
        .call(
            &app,
            M::POST,
            "/api/keys",
            &[],
            Some(&json!({"name": "doc"})),
            Bearer(&token),
        )
        .await;
    let key = created["data"]["key"].as_str().unwrap().to_string();
    let key_id = created["data"]["id"].to_string();
    assert_eq!(
        c.call(
            &app,
            M::POST,
            "/api/keys",
            &[],
            Some(&json!({"name": ""})),
            Bearer(&token)
        )
        .await
        .0,
        422
    );
    assert_eq!(
        c.call(&app, M::GET, "/api/keys", &[], None, Bearer(&token))
            .await
            .0,
        200
    );
    assert_eq!(
        c.call(
            &app,
            M::DELETE,
            "/api/keys/{id}",
            &["999999"],
            None,
            Bearer(&token)
        )
        .await
        .0,
        404
    );
    assert_eq!(
        c.call(
            &app,
            M::DELETE,
            "/api/keys/{id}",
            &["x"],
            None,
            Bearer(&token)
        )
        .await
        .0,
        422
    );
    let (_, other) = c
        .call(
            &app,
            M::POST,
            "/api/keys",
            &[],
            Some(&json!({"name": "to revoke"})),
            Bearer(&token),
        )
        .await;
    let other_id = other["data"]["id"].to_string();
    assert_eq!(
        c.call(
            &app,
            M::DELETE,
            "/api/keys/{id}",
            &[&other_id],
            None,
            Bearer(&token)
        )
        .await
        .0,
        200
    );
    assert_ne!(key_id, other_id);

    // Projects.
    let k = Key(&key);
    assert_eq!(
        c.call(&app, M::GET, "/api/v1/projects", &[], None, Anon)
            .await
            .0,
        401
    );
    let (s, p) = c
        .call(
            &app,
            M::POST,
            "/api/v1/projects",
            &[],
            Some(&json!({"name": "docs", "description": "d"})),
            k,
        )
        .await;
    assert_eq!(s, 200, "{p}");
    assert_eq!(
        c.call(
            &app,
            M::POST,
            "/api/v1/projects",
            &[],
            Some(&json!({"name": "docs"})),
            k
        )
        .await
        .0,
        409
    );
    assert_eq!(
        c.call(
            &app,
            M::POST,
            "/api/v1/projects",
            &[],
            Some(&json!({"name": 5})),
            k
        )
        .await
        .0,
        422
    );
    assert_eq!(
        c.call(&app, M::GET, "/api/v1/projects", &[], None, k)
            .await
            .0,
        200
    );
    assert_eq!(
        c.call(
            &app,
            M::GET,
            "/api/v1/projects/{project_id}",
            &["docs"],
            None,
            k
        )
        .await
        .0,
        200
    );
    assert_eq!(
        c.call(
            &app,
            M::GET,
            "/api/v1/projects/{project_id}",
            &["nope"],
            None,
            k
        )
        .await
        .0,
        404
    );
    assert_eq!(
        c.call(
            &app,
            M::DELETE,
            "/api/v1/projects/{project_id}",
            &["default"],
            None,
            k
        )
        .await
        .0,
        409
    );

    // Memories, tasks, search.
    let new = json!({"content": "Ana prefers window seats", "metadata": {"source": "doc"}, "agent_id": "a1"});
    let (_, queued) = c
        .call(&app, M::POST, "/api/v1/memories", &[], Some(&new), k)
        .await;
    let task = queued["task_id"].as_str().unwrap().to_string();
    assert_eq!(
        c.call(
            &app,
            M::POST,
            "/api/v1/memories",
            &[],
            Some(&json!({"content": " "})),
            k
        )
        .await
        .0,
        422
    );
    assert_eq!(
        c.call(
            &app,
            M::POST,
            "/api/v1/memories",
            &[],
            Some(&json!({"content": "x", "project_id": "nope"})),
            k
        )
        .await
        .0,
        404
    );
    let (_, t) = c
        .call(&app, M::GET, "/api/v1/tasks/{task_id}", &[&task], None, k)
        .await;
    assert!(t["data"]["status"].is_string());
    let done = app.wait_task(&key, &task).await;
    assert_eq!(done["status"], "completed", "{done}");
    let memory = done["memory_id"].as_str().unwrap().to_string();
    c.call(&app, M::GET, "/api/v1/tasks/{task_id}", &[&task], None, k)
        .await;
    assert_eq!(
        c.call(
            &app,
            M::GET,
            "/api/v1/tasks/{task_id}",
            &["00000000-0000-0000-0000-000000000000"],
            None,
            k
        )
        .await
        .0,
        404
    );
    let (s, page) = c.call(&app, M::GET, "/api/v1/memories", &[], None, k).await;
    assert_eq!((s, page["total"].as_i64()), (200, Some(1)), "{page}");
    assert_eq!(
        c.call(&app, M::GET, "/api/v1/memories?limit=0", &[], None, k)
            .await
            .0,
        422
    );
    assert_eq!(
        c.call(
            &app,
            M::GET,
            "/api/v1/memories/{memory_id}",
            &[&memory],
            None,
            k
        )
        .await
        .0,
        200
    );
    let (s, hits) = c
        .call(
            &app,
            M::POST,
            "/api/v1/memories/search",
            &[],
            Some(&json!({"query": "window seat"})),
            k,
        )
        .await;
    assert_eq!(s, 200);
    assert_eq!(hits["data"][0]["id"], memory.as_str(), "{hits}");
    assert_eq!(
        hits["data"][0]["category"],
        hits["data"][0]["cognitive_sector"]
    );
    assert_eq!(
        c.call(
            &app,
            M::POST,
            "/api/v1/memories/search",
            &[],
            Some(&json!({"query": "x", "limit": 101})),
            k
        )
        .await
        .0,
        422
    );

    // MemoryX's paths.
    let batch = json!({"memories": [{"content": "Ana flies to Lisbon on 3 March"}, {"content": "Ana is allergic to peanuts", "metadata": {"tags": ["health"]}}]});
    let (s, queued) = c
        .call(
            &app,
            M::POST,
            "/api/v1/memories/batch",
            &[],
            Some(&batch),
            k,
        )
        .await;
    assert_eq!(s, 200, "{queued}");
    let batch_task = queued["task_id"].as_str().unwrap().to_string();
    assert_eq!(
        c.call(
            &app,
            M::POST,
            "/api/v1/memories/batch",
            &[],
            Some(&json!({"memories": []})),
            k
        )
        .await
        .0,
        422
    );
    let (_, mx) = c
        .call(
            &app,
            M::GET,
            "/api/v1/memories/task/{task_id}",
            &[&batch_task],
            None,
            k,
        )
        .await;
    assert!(
        ["PENDING", "STARTED", "SUCCESS"].contains(&mx["status"].as_str().unwrap_or_default()),
        "{mx}"
    );
    let done = app.wait_task(&key, &batch_task).await;
    assert_eq!(done["status"], "completed", "{done}");
    let (_, mx) = c
        .call(
            &app,
            M::GET,
            "/api/v1/memories/task/{task_id}",
            &[&batch_task],
            None,
            k,
        )
        .await;
    assert_eq!(mx["status"], "SUCCESS", "{mx}");
    assert_eq!(
        c.call(
            &app,
            M::GET,
            "/api/v1/memories/task/{task_id}",
            &["nope"],
            None,
            k
        )
        .await
        .0,
        404
    );
    let (_, listed) = c
        .call(
            &app,
            M::GET,
            "/api/v1/memories/list?limit=10&tags=health",
            &[],
            None,
            k,
        )
        .await;
    assert_eq!(listed["total"], 1, "{listed}");
    assert_eq!(
        c.call(
            &app,
            M::GET,
            "/api/v1/memories/list?time_start=yesterday",
            &[],
            None,
            k
        )
        .await
        .0,
        422
    );
    let fp = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
    let reg = json!({"agent_id": "python_sdk-01234567", "machine_fingerprint": fp, "agent_type": "python_sdk", "agent_name": "box", "platform": "darwin", "platform_version": "23.1"});
    let (s, machine) = c
        .call(
            &app,
            M::POST,
            "/api/agents/auto-register",
            &[],
            Some(&reg),
            Anon,
        )
        .await;
    assert_eq!(s, 200, "{machine}");
    assert_eq!(
        c.call(
            &app,
            M::POST,
            "/api/agents/auto-register",
            &[],
            Some(&json!({})),
            Anon
        )
        .await
        .0,
        422
    );

    // Agents.
    let fp2 = "fedcba9876543210fedcba9876543210";
    let (s, m2) = c
        .call(
            &app,
            M::POST,
            "/api/v1/agents/auto-register",
            &[],
            Some(&json!({"machine_fingerprint": fp2, "platform": "linux"})),
            Anon,
        )
        .await;
    assert_eq!(s, 200, "{m2}");
    assert_eq!(
        c.call(
            &app,
            M::POST,
            "/api/v1/agents/auto-register",
            &[],
            Some(&json!({"machine_fingerprint": "short"})),
            Anon
        )
        .await
        .0,
        422
    );
    let machine_key = m2["data"]["api_key"].as_str().unwrap().to_string();
    let stats = format!("/api/v1/agents/machine-stats?machine_fingerprint={fp2}");
    c.seen
        .insert(("get".into(), "/api/v1/agents/machine-stats".into()));
    for (k2, want) in [(machine_key.as_str(), 200), (key.as_str(), 404)] {
        let (s, b) = app.get(&stats, Some(k2)).await;
        assert_eq!(s.as_u16(), want, "{b}");
        c.check("GET", "/api/v1/agents/machine-stats", want, &b);
    }
    let (s, init) = c
        .call(
            &app,
            M::POST,
            "/api/v1/agents/claim/init",
            &[],
            Some(&json!({"machine_fingerprint": fp2, "email": "doc@example.com"})),
            Anon,
        )
        .await;
    assert_eq!(s, 200, "{init}");
    assert_eq!(
        c.call(
            &app,
            M::POST,
            "/api/v1/agents/claim/init",
            &[],
            Some(&json!({"machine_fingerprint": fp2, "email": "nobody@example.com"})),
            Anon
        )
        .await
        .0,
        404
    );
    let code = init["data"]["verification_code"].as_str().unwrap();
    let wrong = if code == "000000" { "111111" } else { "000000" };
    assert_eq!(
        c.call(
            &app,
            M::POST,
            "/api/v1/agents/claim/verify",
            &[],
            Some(&json!({"machine_fingerprint": fp2, "verification_code": wrong})),
            Anon
        )
        .await
        .0,
        400
    );
    assert_eq!(
        c.call(
            &app,
            M::POST,
            "/api/v1/agents/claim/verify",
            &[],
            Some(&json!({"machine_fingerprint": fp2, "verification_code": code})),
            Anon
        )
        .await
        .0,
        200
    );

    // The public model catalogue (no credential).
    let catalogue =
        br#"{"gpt-4o": {"litellm_provider": "openai", "mode": "chat", "max_input_tokens": 128000,
        "max_output_tokens": 16384, "input_cost_per_token": 2.5e-06, "output_cost_per_token": 1e-05,
        "supports_function_calling": true, "deprecation_date": "2026-10-01"},
        "azure/text-embedding-3-small": {"litellm_provider": "azure", "mode": "embedding"}}"#;
    app::core::models::import(&app.pool, catalogue)
        .await
        .unwrap();
    let (s, found) = c
        .call(
            &app,
            M::GET,
            "/api/v1/models/search?q=gpt&capability=tools",
            &[],
            None,
            Anon,
        )
        .await;
    assert_eq!((s, found["total"].as_i64()), (200, Some(1)), "{found}");
    c.call(&app, M::GET, "/api/v1/models/search", &[], None, Anon)
        .await;
    assert_eq!(
        c.call(
            &app,
            M::GET,
            "/api/v1/models/search?limit=0&sort=cheap",
            &[],
            None,
            Anon
        )
        .await
        .0,
        422
    );
    for (id, status) in [
        ("gpt-4o", 200),
        ("azure%2Ftext-embedding-3-small", 200),
        ("gpt-5x", 404),
    ] {
        assert_eq!(
            c.call(
                &app,
                M::GET,
                "/api/v1/models/search/{model_id}",
                &[id],
                None,
                Anon
            )
            .await
            .0,
            status,
            "{id}"
        );
    }

    // Deletions last.
    assert_eq!(
        c.call(
            &app,
            M::DELETE,
            "/api/v1/memories/{memory_id}",
            &[&memory],
            None,
            k
        )
        .await
        .0,
        200
    );
    assert_eq!(
        c.call(
            &app,
            M::DELETE,
            "/api/v1/memories/{memory_id}",
            &[&memory],
            None,
            k
        )
        .await
        .0,
        404
    );
    assert_eq!(
        c.call(
            &app,
            M::GET,
            "/api/v1/memories/{memory_id}",
            &[&memory],
            None,
            k
        )
        .await
        .0,
        404
    );
    assert_eq!(
        c.call(
            &app,
            M::DELETE,
            "/api/v1/projects/{project_id}",
            &["docs"],
            None,
            k
        )
        .await
        .0,
        200
    );

    // Conversations.
    let (s, conv) = c
        .call(
            &app,
            M::POST,
            "/api/v1/conversations",
            &[],
            Some(&json!({"title": "Doc chat"})),
            k,
        )
        .await;
    assert_eq!(s, 200, "{conv}");
    let conv_id = conv["data"]["id"].as_str().unwrap().to_string();
    assert_eq!(
        c.call(
            &app,
            M::POST,
            "/api/v1/conversations",
            &[],
            Some(&json!({"project_id": "nope"})),
            k
        )
        .await
        .0,
        404
    );
    assert_eq!(
        c.call(
            &app,
            M::POST,
            "/api/v1/conversations",
            &[],
            Some(&json!({"title": 3})),
            k
        )
        .await
        .0,
        422
    );
    let msgs = json!({"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "I moved to Lisbon last spring"}]});
    let (s, appended) = c
        .call(
            &app,
            M::POST,
            "/api/v1/conversations/{conversation_id}/messages",
            &[&conv_id],
            Some(&msgs),
            k,
        )
        .await;
    assert_eq!(s, 200, "{appended}");
    let task = appended["task_ids"][1].as_str().unwrap().to_string();
    app.wait_task(&key, &task).await;
    assert_eq!(
        c.call(
            &app,
            M::POST,
            "/api/v1/conversations/{conversation_id}/messages",
            &[&conv_id],
            Some(&json!({"messages": [{"role": "x", "content": "y"}]})),
            k
        )
        .await
        .0,
        422
    );
    assert_eq!(
        c.call(
            &app,
            M::POST,
            "/api/v1/conversations/{conversation_id}/messages",
            &["00000000-0000-0000-0000-000000000000"],
            Some(&msgs),
            k
        )
        .await
        .0,
        404
    );
    assert_eq!(
        c.call(&app, M::GET, "/api/v1/conversations", &[], None, k)
            .await
            .0,
        200
    );
    assert_eq!(
        c.call(&app, M::GET, "/api/v1/conversations?limit=0", &[], None, k)
            .await
            .0,
        422
    );
    let (s, got) = c
        .call(
            &app,
            M::GET,
            "/api/v1/conversations/{conversation_id}",
            &[&conv_id],
            None,
            k,
        )
        .await;
    assert_eq!(s, 200, "{got}");
    assert_eq!(got["messages"][1]["task_status"], "completed");
    assert_eq!(
        c.call(
            &app,
            M::GET,
            "/api/v1/conversations/{conversation_id}",
            &["nope"],
            None,
            k
        )
        .await
        .0,
        404
    );
    let flush = json!({"conversation_id": "doc-chat", "messages": [{"role": "user", "content": "hi", "timestamp": 1_764_000_000_000_i64, "tokens": 1}]});
    assert_eq!(
        c.call(
            &app,
            M::POST,
            "/api/v1/conversations/flush",
            &[],
            Some(&flush),
            k
        )
        .await
        .0,
        200
    );
    assert_eq!(
        c.call(
            &app,
            M::POST,
            "/api/v1/conversations/flush",
            &[],
            Some(&json!({"messages": []})),
            k
        )
        .await
        .0,
        422
    );
    assert_eq!(
        c.call(
            &app,
            M::DELETE,
            "/api/v1/conversations/{conversation_id}?memories=delete",
            &[&conv_id],
            None,
            k
        )
        .await
        .0,
        200
    );
    assert_eq!(
        c.call(
            &app,
            M::DELETE,
            "/api/v1/conversations/{conversation_id}",
            &[&conv_id],
            None,
            k
        )
        .await
        .0,
        404
    );

    // The proxy: settings, then OpenAI's routes against the stand-in upstream.
    let (upstream, _) = server::standin::spawn(server::standin::Options::default()).await;
    let (s, none) = c
        .call(&app, M::GET, "/api/v1/proxy/settings", &[], None, k)
        .await;
    assert_eq!((s, none["data"]["source"].as_str()), (200, Some("none")));
    assert_eq!(
        c.call(&app, M::DELETE, "/api/v1/proxy/settings", &[], None, k)
            .await
            .0,
        404
    );
    let bearer_chat = |c: &mut Conformance, status: u16, body: &Value| {
        c.check("POST", "/api/v1/chat/completions", status, body)
    };
    let chat = json!({"messages": [{"role": "user", "content": "Where do I live?"}]});
    let (s, b) = body(
        app.http
            .post(app.url("/api/v1/chat/completions"))
            .bearer_auth(&key)
            .json(&chat)
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(s, 400, "no upstream yet: {b}");
    bearer_chat(&mut c, 400, &b);
    assert_eq!(
        c.call(
            &app,
            M::PUT,
            "/api/v1/proxy/settings",
            &[],
            Some(&json!({"base_url": "ftp://x"})),
            k
        )
        .await
        .0,
        422
    );
    let (s, set) = c
        .call(
            &app,
            M::PUT,
            "/api/v1/proxy/settings",
            &[],
            Some(&json!({"base_url": upstream, "api_key": "sk-doc", "model": "standin-small"})),
            k,
        )
        .await;
    assert_eq!(s, 200, "{set}");
    let (s, b) = body(
        app.http
            .post(app.url("/api/v1/chat/completions"))
            .bearer_auth(&key)
            .json(&chat)
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(s, 200, "{b}");
    bearer_chat(&mut c, 200, &b);
    let (s, b) = body(
        app.http
            .post(app.url("/api/v1/chat/completions"))
            .bearer_auth("engram_wrong")
            .json(&chat)
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(s, 401);
    bearer_chat(&mut c, 401, &b);
    let (s, b) = body(
        app.http
            .post(app.url("/api/v1/chat/completions"))
            .bearer_auth(&key)
            .header("x-engram-project", "nope")
            .json(&chat)
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(s, 404);
    bearer_chat(&mut c, 404, &b);
    let (s, b) = c
        .call(&app, M::GET, "/api/v1/models", &[], None, Bearer(&key))
        .await;
    assert_eq!(s, 200, "{b}");
    assert_eq!(
        c.call(&app, M::GET, "/api/v1/models", &[], None, Anon)
            .await
            .0,
        401
    );
    assert_eq!(
        c.call(&app, M::GET, "/api/v1/proxy/settings", &[], None, k)
            .await
            .0,
        200
    );
    assert_eq!(
        c.call(&app, M::DELETE, "/api/v1/proxy/settings", &[], None, k)
            .await
            .0,
        200
    );

    // Export (JSON Lines, not JSON: its content type is checked) and import.
    let r = app
        .http
        .get(app.url("/api/v1/export"))
        .header("x-api-key", &key)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let ndjson = c.operation("GET", "/api/v1/export")["responses"]["200"]["content"]
        .get("application/x-ndjson")
        .is_some();
    assert!(ndjson, "the export is documented as JSON Lines");
    assert_eq!(r.headers()["content-type"], "application/x-ndjson");
    c.seen.insert(("get".into(), "/api/v1/export".into()));
    let exported = r.text().await.unwrap();
    for (payload, status) in [(exported, 200), ("not json".to_string(), 422)] {
        let (s, b) = body(
            app.http
                .post(app.url("/api/v1/import"))
                .header("x-api-key", &key)
                .header("content-type", "application/x-ndjson")
                .body(payload)
                .send()
                .await
                .unwrap(),
        )
        .await;
        assert_eq!(s, status, "{b}");
        c.check("POST", "/api/v1/import", status, &b);
    }

    // Statistics, the subscription and its quotas, the billing webhook.
    for (template, auth, status) in [
        ("/api/stats", k, 200),
        ("/api/stats", Bearer(&token), 200),
        ("/api/stats", Anon, 401),
        ("/api/stats/usage?days=7", k, 200),
        ("/api/stats/usage?days=0", k, 422),
        ("/api/subscription/status", k, 200),
        ("/api/subscription/status", Anon, 401),
        ("/api/v1/quota", k, 200),
        ("/api/v1/quota", Anon, 401),
    ] {
        let (s, b) = c.call(&app, M::GET, template, &[], None, auth).await;
        assert_eq!(s, status, "{template}: {b}");
    }
    let secret = app.state.settings.billing.webhook_secret.clone().unwrap();
    let event = serde_json::to_vec(
        &json!({"id": "evt_doc", "type": "customer.subscription.updated",
        "data": {"object": {"metadata": {"email": "doc@example.com", "plan": "free"}}}}),
    )
    .unwrap();
    let now = chrono::Utc::now().timestamp();
    for (signature, status) in [
        (app::core::plans::sign(b"wrong", &event, now), 400),
        (app::core::plans::sign(secret.as_bytes(), &event, now), 200),
        (app::core::plans::sign(secret.as_bytes(), &event, now), 409),
    ] {
        let (s, b) = body(
            app.http
                .post(app.url("/api/subscription/webhook"))
                .header("content-type", "application/json")
                .header("stripe-signature", signature)
                .body(event.clone())
                .send()
                .await
                .unwrap(),
        )
        .await;
        assert_eq!(s, status, "{b}");
        c.check("POST", "/api/subscription/webhook", status, &b);
    }
    // On the free plan now; a plan of no memories refuses the next one (402).
    app::core::plans::define(
        &app.pool,
        "none",
        None,
        None,
        [Some(0), None, None, None, None, None],
    )
    .await
    .unwrap();
    app::core::plans::assign(&app.pool, "doc@example.com", "none", None)
        .await
        .unwrap();
    app.state.quotas.forget_all();
    let (s, b) = c
        .call(
            &app,
            M::POST,
            "/api/v1/memories",
            &[],
            Some(&json!({"content": "one too many"})),
            k,
        )
        .await;
    assert_eq!(s, 402, "{b}");

    c.assert_all_exercised();
}

/// The checker itself refuses what the document does not say: an extra field, a missing one,
/// a wrong type, an undocumented status.
#[test]
fn the_checker_refuses_shapes_the_document_does_not_describe() {
    let doc: Value = serde_json::from_str(&server::api::openapi().to_json().unwrap()).unwrap();
    let c = Conformance::new(doc);
    let ok = json!({"success": true, "message": "Memory deleted"});
    c.violations("DELETE", "/api/v1/memories/{memory_id}", 200, &ok)
        .unwrap();
    for bad in [
        json!({"success": true, "message": "Memory deleted", "extra": 1}),
        json!({"success": true}),
        json!({"success": "yes", "message": "Memory deleted"}),
    ] {
        assert!(
            c.violations("DELETE", "/api/v1/memories/{memory_id}", 200, &bad)
                .is_err(),
            "{bad}"
        );
    }
    let err = json!({"success": false, "detail": "Memory not found"});
    c.violations("DELETE", "/api/v1/memories/{memory_id}", 404, &err)
        .unwrap();
    assert!(c
        .violations("DELETE", "/api/v1/memories/{memory_id}", 409, &err)
        .is_err());
    let nested = json!({"success": true, "data": [{"id": "x", "extra": true}], "query": "q"});
    assert!(c
        .violations("POST", "/api/v1/memories/search", 200, &nested)
        .is_err());
}

/// Each request example the document shows is accepted as it stands (no 422).
#[tokio::test]
async fn the_documented_request_examples_are_valid() {
    let app = common::spawn_app().await;
    let (_, doc) = app.get("/api/openapi.json", None).await;
    let (_, key) = app.user("examples@example.com").await;
    let mut checked = 0;
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            let Some(schema) = op.pointer("/requestBody/content/application~1json/schema") else {
                continue;
            };
            let schema = match schema.get("$ref").and_then(Value::as_str) {
                Some(r) => &doc["components"]["schemas"][r.rsplit('/').next().unwrap()],
                None => schema,
            };
            let Some(example) = schema
                .get("example")
                .or_else(|| schema.pointer("/examples/0"))
            else {
                panic!("{method} {path}: the request body has no example");
            };
            let req = app
                .http
                .request(method.to_uppercase().parse().unwrap(), app.url(path))
                .header("x-api-key", &key)
                .json(example);
            let (s, b) = body(req.send().await.unwrap()).await;
            assert_ne!(s, 422, "{method} {path}: its own example is refused: {b}");
            checked += 1;
        }
    }
    assert!(checked >= 10, "only {checked} examples");
}

/// The reference page and its assets are served by this server, not a CDN.
#[tokio::test]
async fn the_reference_page_is_served_locally() {
    let app = common::spawn_app().await;
    let page = app.http.get(app.url("/api/docs")).send().await.unwrap();
    assert_eq!(page.status(), 200);
    let html = page.text().await.unwrap();
    assert!(html.contains("/api/openapi.json"), "{html}");
    assert!(
        !html.contains("https://"),
        "the page loads something remote: {html}"
    );
    let js = app
        .http
        .get(app.url("/api/docs/swagger-ui-bundle.js"))
        .send()
        .await
        .unwrap();
    assert_eq!(js.status(), 200);
    assert!(js.text().await.unwrap().len() > 100_000);
}
