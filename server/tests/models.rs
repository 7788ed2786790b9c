//! The public model catalogue: import from litellm's price list, search over HTTP with every
//! filter, sort and limit, one model, the per-address rate limit, and a second process seeing an
//! import without a restart.
mod common;

use common::*;
use serde_json::{json, Value};

/// The list setup extracts from the pinned litellm wheel.
fn catalogue_file() -> Vec<u8> {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../models/litellm/model_prices_and_context_window.json"
    );
    std::fs::read(path).unwrap_or_else(|e| panic!("{path}: {e} (run `make setup`)"))
}

async fn imported_app() -> TestApp {
    let app = spawn_app().await;
    app::core::models::import(&app.pool, &catalogue_file())
        .await
        .unwrap();
    app
}

async fn search(app: &TestApp, query: &str) -> Value {
    let (s, b) = app
        .get(&format!("/api/v1/models/search?{query}"), None)
        .await;
    assert_eq!(s, 200, "{query}: {b}");
    b
}

fn ids(page: &Value) -> Vec<String> {
    page["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap().to_string())
        .collect()
}

fn all(page: &Value) -> &Vec<Value> {
    page["data"].as_array().unwrap()
}

#[tokio::test]
async fn the_import_counts_what_it_loads_and_a_newer_list_updates_in_place() {
    let app = spawn_app().await;
    let file = catalogue_file();
    let entries = serde_json::from_slice::<serde_json::Map<String, Value>>(&file)
        .unwrap()
        .len() as u64;
    let first = app::core::models::import(&app.pool, &file).await.unwrap();
    let skipped = first.skipped.len() as u64;
    assert_eq!(first.inserted + skipped, entries, "{first:?}");
    assert!(first.inserted > 4000, "{first:?}");
    assert_eq!((first.updated, first.unchanged, first.removed), (0, 0, 0));
    // Only what is not a model is skipped: the documentation entry, litellm's fallback rule,
    // Fireworks' price tiers, and the two entries without a mode.
    let mut skipped_ids: Vec<&str> = first.skipped.iter().map(|s| s.id.as_str()).collect();
    skipped_ids.sort();
    assert!(
        skipped_ids.contains(&"sample_spec") && skipped_ids.contains(&"fallback_generalizations")
    );
    assert!(skipped_ids.contains(&"fireworks-ai-up-to-4b"));
    assert!(skipped < 20, "{skipped_ids:?}");
    let count: i64 = sqlx::query_scalar("select count(*) from models")
        .fetch_one(&app.pool)
        .await
        .unwrap();
    assert_eq!(count as u64, first.inserted);
    let version = |pool: sqlx::PgPool| async move {
        sqlx::query_scalar::<_, i64>("select version from model_catalog")
            .fetch_one(&pool)
            .await
            .unwrap()
    };
    let v1 = version(app.pool.clone()).await;

    // The same list again changes nothing.
    let again = app::core::models::import(&app.pool, &file).await.unwrap();
    assert_eq!(
        (
            again.inserted,
            again.updated,
            again.unchanged,
            again.removed
        ),
        (0, 0, first.inserted, 0)
    );
    assert_eq!(version(app.pool.clone()).await, v1);

    // A newer list: one price changed, one model gone, one new.
    let mut newer: serde_json::Map<String, Value> = serde_json::from_slice(&file).unwrap();
    newer["gpt-4o"]["input_cost_per_token"] = json!(2e-06);
    newer.remove("gpt-4o-mini").unwrap();
    newer.insert(
        "acme/brand-new-1".into(),
        json!({"litellm_provider": "acme", "mode": "chat", "max_input_tokens": 1000}),
    );
    let updated_at_before: chrono::DateTime<chrono::Utc> =
        sqlx::query_scalar("select updated_at from models where id = 'claude-sonnet-4-5'")
            .fetch_one(&app.pool)
            .await
            .unwrap();
    let third = app::core::models::import(&app.pool, &serde_json::to_vec(&newer).unwrap())
        .await
        .unwrap();
    assert_eq!(
        (third.inserted, third.updated, third.removed),
        (1, 1, 1),
        "{third:?}"
    );
    assert_eq!(third.unchanged, first.inserted - 2);
    assert_eq!(version(app.pool.clone()).await, v1 + 1);
    let price: f64 =
        sqlx::query_scalar("select input_price_per_mtok::float8 from models where id = 'gpt-4o'")
            .fetch_one(&app.pool)
            .await
            .unwrap();
    assert_eq!(price, 2.0);
    let untouched: chrono::DateTime<chrono::Utc> =
        sqlx::query_scalar("select updated_at from models where id = 'claude-sonnet-4-5'")
            .fetch_one(&app.pool)
            .await
            .unwrap();
    assert_eq!(
        untouched, updated_at_before,
        "unchanged rows are not rewritten"
    );

    // Not a price list at all.
    assert!(app::core::models::import(&app.pool, b"[1, 2]")
        .await
        .is_err());
}

#[tokio::test]
async fn text_search_finds_models_by_name_family_and_provider_with_typos() {
    let app = imported_app().await;

    // An exact id comes first, with exact prices per million tokens.
    let page = search(&app, "q=gpt-4o").await;
    let top = &all(&page)[0];
    assert_eq!(top["id"], "gpt-4o", "{page}");
    assert_eq!(top["provider"], "openai");
    assert_eq!(top["family"], "gpt");
    assert_eq!(top["input_price_per_mtok"], json!(2.5));
    assert_eq!(top["output_price_per_mtok"], json!(10.0));
    assert_eq!(top["context_window"], 128000);
    assert!(top["capabilities"]
        .as_array()
        .unwrap()
        .contains(&json!("tools")));

    // Every word counts: all results are Claude Sonnets.
    let page = search(&app, "q=claude+sonnet&limit=100").await;
    assert!(page["total"].as_i64().unwrap() > 20, "{}", page["total"]);
    for id in ids(&page) {
        let id = id.to_lowercase();
        assert!(id.contains("claude") && id.contains("sonnet"), "{id}");
    }
    // A first-party id ranks above the same model behind a route prefix.
    assert!(!ids(&page)[0].contains('/'), "{:?}", &ids(&page)[..5]);

    // Typos: a swap, a missing letter.
    let typo = search(&app, "q=cluade+sonet&limit=100").await;
    assert_eq!(typo["total"], page["total"], "typos find the same models");

    // Sizes and families across providers.
    let llama = search(&app, "q=llama+70b&limit=100").await;
    assert!(llama["total"].as_i64().unwrap() >= 5);
    for id in ids(&llama) {
        let id = id.to_lowercase();
        assert!(id.contains("llama") && id.contains("70b"), "{id}");
    }
    // Written without separators.
    let joined = search(&app, "q=gpt4o").await;
    assert!(ids(&joined).contains(&"gpt-4o".to_string()), "{joined}");
    // By provider name.
    let by_provider = search(&app, "q=anthropic+haiku&limit=5").await;
    assert!(by_provider["total"].as_i64().unwrap() > 0);
    // Nothing.
    let none = search(&app, "q=zzzqqqxxx").await;
    assert_eq!(none["total"], 0);
    assert!(all(&none).is_empty());
}

#[tokio::test]
async fn filters_sorts_and_pages_hold_for_every_result() {
    let app = imported_app().await;
    let total_all = search(&app, "").await["total"].as_i64().unwrap();
    assert!(total_all > 4000);

    let page = search(&app, "provider=anthropic&limit=100").await;
    assert!(!all(&page).is_empty());
    assert!(all(&page).iter().all(|m| m["provider"] == "anthropic"));

    let page = search(&app, "mode=embedding&limit=100").await;
    assert!(all(&page).iter().all(|m| m["mode"] == "embedding"));
    assert!(page["total"].as_i64().unwrap() > 50);

    let page = search(&app, "min_context=200000&limit=100").await;
    assert!(all(&page)
        .iter()
        .all(|m| m["context_window"].as_i64().unwrap() >= 200_000));

    // The question of the issue: 200k tokens, tools, under $1 per million input tokens.
    let page = search(
        &app,
        "min_context=200000&capability=tools&max_input_price=1&mode=chat&limit=100",
    )
    .await;
    assert!(page["total"].as_i64().unwrap() > 0);
    for m in all(&page) {
        assert!(m["context_window"].as_i64().unwrap() >= 200_000, "{m}");
        assert!(m["input_price_per_mtok"].as_f64().unwrap() <= 1.0, "{m}");
        assert!(m["capabilities"]
            .as_array()
            .unwrap()
            .contains(&json!("tools")));
    }

    let page = search(&app, "max_output_price=0.5&limit=100").await;
    assert!(all(&page)
        .iter()
        .all(|m| m["output_price_per_mtok"].as_f64().unwrap() <= 0.5));

    // Capabilities: repeated and comma-separated mean the same.
    let repeated = search(
        &app,
        "capability=tools&capability=vision&capability=caching",
    )
    .await;
    let commas = search(&app, "capability=tools,vision,caching").await;
    assert_eq!(repeated["total"], commas["total"]);
    for m in all(&repeated) {
        let caps = m["capabilities"].as_array().unwrap();
        for c in ["tools", "vision", "caching"] {
            assert!(caps.contains(&json!(c)), "{m}");
        }
    }

    // Sorts.
    let by_price = search(&app, "q=claude&sort=price&limit=100").await;
    let prices: Vec<f64> = all(&by_price)
        .iter()
        .map(|m| m["input_price_per_mtok"].as_f64().unwrap_or(f64::INFINITY))
        .collect();
    assert!(prices.windows(2).all(|w| w[0] <= w[1]), "{prices:?}");
    let by_context = search(&app, "mode=chat&sort=context&limit=100").await;
    let contexts: Vec<i64> = all(&by_context)
        .iter()
        .map(|m| m["context_window"].as_i64().unwrap_or(-1))
        .collect();
    assert!(contexts.windows(2).all(|w| w[0] >= w[1]), "{contexts:?}");
    assert!(contexts[0] >= 1_000_000, "{contexts:?}");

    // Pages: disjoint, in order, and the total does not move.
    let p1 = search(&app, "q=gpt&limit=10").await;
    let p2 = search(&app, "q=gpt&limit=10&offset=10").await;
    let both = search(&app, "q=gpt&limit=20").await;
    assert_eq!(p1["total"], p2["total"]);
    assert_eq!(
        (p1["limit"].as_i64(), p2["offset"].as_i64()),
        (Some(10), Some(10))
    );
    let mut joined = ids(&p1);
    joined.extend(ids(&p2));
    assert_eq!(joined, ids(&both));
    let default_page = search(&app, "q=gpt").await;
    assert_eq!(all(&default_page).len(), 20);
    let past_end = search(&app, "q=gpt&offset=100000").await;
    assert!(all(&past_end).is_empty());
    assert_eq!(past_end["total"], p1["total"]);
}

#[tokio::test]
async fn bad_parameters_are_422_and_unknown_models_404() {
    let app = imported_app().await;
    for (query, field) in [
        ("limit=0", "limit"),
        ("limit=101", "limit"),
        ("offset=-1", "offset"),
        ("sort=cheapest", "sort"),
        ("capability=telepathy", "capability"),
        ("min_context=lots", "min_context"),
        ("max_input_price=-1", "max_input_price"),
        ("max_output_price=abc", "max_output_price"),
    ] {
        let (s, b) = app
            .get(&format!("/api/v1/models/search?{query}"), None)
            .await;
        assert_validation(s, &b, &["query", field]);
    }
    let long = "x".repeat(201);
    let (s, b) = app
        .get(&format!("/api/v1/models/search?q={long}"), None)
        .await;
    assert_validation(s, &b, &["query", "q"]);

    let (s, b) = app.get("/api/v1/models/search/gpt-4o", None).await;
    assert_eq!(s, 200, "{b}");
    assert_eq!(b["data"]["id"], "gpt-4o");
    // An id with a route prefix, its slash percent-encoded.
    let (s, b) = app.get("/api/v1/models/search/azure%2Fgpt-4o", None).await;
    assert_eq!(s, 200, "{b}");
    assert_eq!(b["data"]["provider"], "azure");
    let (s, b) = app.get("/api/v1/models/search/no-such-model", None).await;
    assert_eq!(s, 404, "{b}");
    assert_eq!(b["success"], false);
}

#[tokio::test]
async fn searches_are_limited_per_client_address() {
    let mut settings = app::core::state::Settings::for_tests();
    settings.limits.models_per_minute = 3;
    let app = spawn_with(Opts {
        settings,
        ..Opts::default()
    })
    .await;
    for _ in 0..3 {
        assert_eq!(app.get("/api/v1/models/search?q=gpt", None).await.0, 200);
    }
    let r = app
        .http
        .get(app.url("/api/v1/models/search/gpt-4o"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 429);
    let wait: u64 = r.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=60).contains(&wait));
}

#[tokio::test]
async fn a_second_process_sees_an_import_without_a_restart() {
    let app = spawn_app().await;
    // Another process on the same database: its own state, its own copy of the catalogue.
    let pool = server::connect(&app.db_url).await.unwrap();
    let other = server::build_state(
        pool,
        app::core::state::Settings::for_tests(),
        app::core::embed::EmbedderHandle::new(app::core::embed::default_model_dir()),
        "target/site",
    );
    let (other_base, _server) = serve(other).await;
    let count = |base: String| async move {
        let r = client()
            .get(format!("{base}/api/v1/models/search?q=gpt-4o"))
            .send()
            .await
            .unwrap();
        body(r).await.1["total"].as_i64().unwrap()
    };
    assert_eq!(
        count(other_base.clone()).await,
        0,
        "empty before the import"
    );
    app::core::models::import(&app.pool, &catalogue_file())
        .await
        .unwrap();
    let started = std::time::Instant::now();
    loop {
        if count(other_base.clone()).await > 0 {
            break;
        }
        assert!(
            started.elapsed() < app::core::models::RECHECK * 3,
            "the other process never reloaded"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}
