//! The public model catalogue (`/models`, no log-in): a search box and filters whose state is the
//! URL (shareable, and a plain GET form without JavaScript), results that update as the user
//! types once hydrated, sortable columns, and one page per model.
use leptos::prelude::*;
use leptos_router::components::A;
use leptos_router::hooks::{use_location, use_navigate, use_params_map, use_query_map};
use serde::{Deserialize, Serialize};

use crate::types::ModelView;

/// One page of results, and what the filters offer.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CatalogPage {
    pub items: Vec<ModelView>,
    pub total: i64,
    pub limit: i64,
    pub offset: i64,
    /// The query's problems, field by field (nothing is searched then).
    pub errors: Vec<(String, String)>,
}

/// The capabilities offered as check boxes, with their labels.
const CAPABILITY_LABELS: [(&str, &str); 6] = [
    ("tools", "Tools"),
    ("vision", "Vision"),
    ("json", "JSON schema"),
    ("caching", "Prompt caching"),
    ("reasoning", "Reasoning"),
    ("pdf", "PDF input"),
];

#[cfg(feature = "ssr")]
async fn catalog() -> Result<std::sync::Arc<crate::core::models::Loaded>, ServerFnError> {
    use super::session::{client_key, server_error, state};
    let state = state()?;
    let client = client_key(&state).await;
    crate::core::models::for_client(&state, &client)
        .await
        .map_err(server_error)
}

/// Searches with the API's own rules, from the page's query string.
#[server(prefix = "/portal/fn")]
pub async fn find_models(query: String) -> Result<CatalogPage, ServerFnError> {
    use crate::core::error::AppError;
    use crate::core::models::{search, ModelQuery};
    use crate::core::validate::{Fields, FromFields};
    let catalog = catalog().await?;
    match ModelQuery::read(Fields::from_query(Some(&query))) {
        Ok(q) => {
            let found = search(&catalog, &q);
            Ok(CatalogPage {
                items: found.items.into_iter().cloned().collect(),
                total: found.total as i64,
                limit: q.limit,
                offset: q.offset,
                errors: vec![],
            })
        }
        Err(AppError::Validation(errors)) => Ok(CatalogPage {
            items: vec![],
            total: 0,
            limit: 20,
            offset: 0,
            errors: errors.iter().map(|e| (e.field(), e.msg.clone())).collect(),
        }),
        Err(e) => Err(super::session::server_error(e)),
    }
}

/// The providers and modes the filters offer.
#[server(prefix = "/portal/fn")]
pub async fn catalog_facets() -> Result<(Vec<String>, Vec<String>), ServerFnError> {
    let catalog = catalog().await?;
    Ok((catalog.providers(), catalog.modes()))
}

#[server(prefix = "/portal/fn")]
pub async fn get_catalog_model(id: String) -> Result<Option<ModelView>, ServerFnError> {
    let catalog = catalog().await?;
    Ok(catalog.get(&id).cloned())
}

/// `$2.50`, `$0.075`, `—`.
pub fn price(p: Option<f64>) -> String {
    match p {
        None => "—".into(),
        Some(0.0) => "free".into(),
        Some(p) if p >= 1.0 => format!("${p:.2}"),
        Some(p) => format!("${}", trim_zeros(format!("{p:.4}"))),
    }
}

fn trim_zeros(s: String) -> String {
    let t = s.trim_end_matches('0');
    let t = t.strip_suffix('.').unwrap_or(t);
    if t.ends_with('.') || !t.contains('.') {
        format!("{t}.00")
    } else if t.split('.').nth(1).map(str::len) == Some(1) {
        format!("{t}0")
    } else {
        t.to_string()
    }
}

/// `128k`, `1M`, `2.1M`, `—`.
pub fn tokens(n: Option<i64>) -> String {
    match n {
        None => "—".into(),
        Some(n) if n >= 1_000_000 => {
            let m = n as f64 / 1_000_000.0;
            if (m - m.round()).abs() < 0.05 {
                format!("{}M", m.round())
            } else {
                format!("{m:.1}M")
            }
        }
        Some(n) if n >= 1_000 => format!("{}k", (n as f64 / 1000.0).round()),
        Some(n) => n.to_string(),
    }
}

/// The query string with `key` set to `value` (removed when empty) and the page reset.
fn with_param(query: &str, key: &str, value: &str) -> String {
    let mut pairs: Vec<(String, String)> = query
        .trim_start_matches('?')
        .split('&')
        .filter(|p| !p.is_empty())
        .filter_map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (k != key && k != "offset").then(|| (k.to_string(), v.to_string()))
        })
        .collect();
    if !value.is_empty() {
        pairs.push((key.to_string(), value.to_string()));
    }
    if pairs.is_empty() {
        String::new()
    } else {
        let joined: Vec<String> = pairs.into_iter().map(|(k, v)| format!("{k}={v}")).collect();
        format!("?{}", joined.join("&"))
    }
}

fn page_link(query: &str, offset: i64) -> String {
    let base = with_param(query, "offset", "");
    let sep = if base.is_empty() { "?" } else { "&" };
    format!("/models{base}{sep}offset={offset}")
}

fn decode(s: &str) -> String {
    if !s.contains('%') {
        return s.to_string();
    }
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or("");
            if let Ok(b) = u8::from_str_radix(hex, 16) {
                out.push(b);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[component]
pub fn ModelsPage() -> impl IntoView {
    let query = use_query_map();
    let location = use_location();
    let search = move || location.search.get().trim_start_matches('?').to_string();
    let page = Resource::new(search, find_models);
    let facets = Resource::new(|| (), |_| catalog_facets());
    let form = NodeRef::<leptos::html::Form>::new();
    let navigate = use_navigate();
    // Hydrated, every change of the form becomes the URL (replacing, not stacking history),
    // and the URL drives the results.
    let update = move || {
        #[cfg(feature = "hydrate")]
        if let Some(form) = form.get() {
            use leptos::wasm_bindgen::JsCast;
            let Ok(data) = leptos::web_sys::FormData::new_with_form(&form) else {
                return;
            };
            let Ok(params) = leptos::web_sys::UrlSearchParams::new_with_str_sequence_sequence(
                data.unchecked_ref(),
            ) else {
                return;
            };
            let qs: Vec<String> = String::from(params.to_string())
                .split('&')
                .filter(|p| !p.is_empty() && !p.ends_with('='))
                .map(str::to_string)
                .collect();
            let url = if qs.is_empty() {
                "/models".to_string()
            } else {
                format!("/models?{}", qs.join("&"))
            };
            navigate(
                &url,
                leptos_router::NavigateOptions {
                    replace: true,
                    scroll: false,
                    ..Default::default()
                },
            );
        }
        #[cfg(not(feature = "hydrate"))]
        let _ = (&form, &navigate);
    };
    let get = move |k: &str| query.read_untracked().get(k).unwrap_or_default();
    let caps = query
        .read_untracked()
        .get_all("capability")
        .unwrap_or_default()
        .iter()
        .flat_map(|c| c.split(',').map(str::to_string).collect::<Vec<_>>())
        .collect::<Vec<_>>();
    let (q0, provider0, mode0, sort0, ctx0, price0) = (
        get("q"),
        get("provider"),
        get("mode"),
        get("sort"),
        get("min_context"),
        get("max_input_price"),
    );
    let (on_input, on_change) = (update.clone(), update.clone());
    view! {
        <h1>"Model search"</h1>
        <p class="muted">"Every model litellm's price list knows: context window, price per million tokens, capabilities. No account needed; the URL is shareable."</p>
        <form method="get" action="/models" class="card model-filters" node_ref=form
            on:submit=move |ev| { ev.prevent_default(); update() }
            on:input=move |_| on_input() on:change=move |_| on_change()>
            <label class="grow">"Search"
                <input type="search" name="q" value=q0 placeholder="claude sonnet, gpt-4o, llama 70b…" autocomplete="off" data-test-id="model-q" aria-label="Search models"/>
            </label>
            <Suspense fallback=|| ()>
                {move || {
                    let (provider0, mode0) = (provider0.clone(), mode0.clone());
                    Suspend::new(async move {
                    let (providers, modes) = facets.await.unwrap_or_default();
                    view! {
                        <label>"Provider"
                            <select name="provider" data-test-id="model-provider">
                                <option value="">"Any"</option>
                                {providers.into_iter().map(|p| { let selected = p == provider0; view! { <option value=p.clone() selected=selected>{p.clone()}</option> } }).collect_view()}
                            </select>
                        </label>
                        <label>"Mode"
                            <select name="mode" data-test-id="model-mode">
                                <option value="">"Any"</option>
                                {modes.into_iter().map(|m| { let selected = m == mode0; view! { <option value=m.clone() selected=selected>{m.clone()}</option> } }).collect_view()}
                            </select>
                        </label>
                    }
                })}}
            </Suspense>
            <label>"Context at least"
                <input type="number" name="min_context" min="0" step="1000" value=ctx0 placeholder="200000" data-test-id="model-min-context"/>
            </label>
            <label>"Input $/M at most"
                <input type="number" name="max_input_price" min="0" step="0.01" value=price0 placeholder="1.00" data-test-id="model-max-price"/>
            </label>
            <label>"Sort"
                <select name="sort" data-test-id="model-sort">
                    <option value="" selected=sort0.is_empty()>"Best match"</option>
                    <option value="price" selected=sort0 == "price">"Cheapest input"</option>
                    <option value="context" selected=sort0 == "context">"Largest context"</option>
                </select>
            </label>
            <fieldset class="capabilities">
                <legend>"Capabilities"</legend>
                {CAPABILITY_LABELS.iter().map(|(name, label)| {
                    let checked = caps.iter().any(|c| c == name);
                    view! {
                        <label class="check"><input type="checkbox" name="capability" value=*name checked=checked data-test-id=format!("model-cap-{name}")/>{*label}</label>
                    }
                }).collect_view()}
            </fieldset>
            <noscript><button type="submit">"Search"</button></noscript>
        </form>
        <Transition fallback=|| view! { <p>"Loading…"</p> }>
            {move || Suspend::new(async move {
                let current = search();
                match page.await {
                    Ok(p) if !p.errors.is_empty() => view! {
                        <ul class="error" data-test-id="model-errors">
                            {p.errors.into_iter().map(|(f, m)| view! { <li>{format!("{f}: {m}")}</li> }).collect_view()}
                        </ul>
                    }.into_any(),
                    Ok(p) => {
                        let (offset, limit, total) = (p.offset, p.limit, p.total);
                        let sort_link = |key: &str| format!("/models{}", with_param(&current, "sort", key));
                        view! {
                            <p class="muted" data-test-id="model-total" aria-live="polite">
                                {if total == 0 { "No model matches.".to_string() } else { format!("{total} models; {}–{}", offset + 1, (offset + limit).min(total)) }}
                            </p>
                            <table class="models" data-test-id="model-results">
                                <thead><tr>
                                    <th scope="col"><A href=sort_link("")>"Model"</A></th>
                                    <th scope="col">"Provider"</th>
                                    <th scope="col">"Mode"</th>
                                    <th scope="col" class="num"><A href=sort_link("context") attr:data-test-id="sort-context">"Context"</A></th>
                                    <th scope="col" class="num"><A href=sort_link("price") attr:data-test-id="sort-price">"Input $/M"</A></th>
                                    <th scope="col" class="num">"Output $/M"</th>
                                    <th scope="col">"Capabilities"</th>
                                </tr></thead>
                                <tbody>
                                    {p.items.into_iter().map(|m| view! {
                                        <tr data-test-id="model-row">
                                            <td><A href=format!("/models/{}", m.id) attr:data-test-id="model-link">{m.id.clone()}</A></td>
                                            <td data-test-id="model-row-provider">{m.provider.clone()}</td>
                                            <td>{m.mode.clone()}</td>
                                            <td class="num">{tokens(m.context_window)}</td>
                                            <td class="num" data-test-id="model-row-input-price" data-value=m.input_price_per_mtok.map(|p| p.to_string()).unwrap_or_default()>{price(m.input_price_per_mtok)}</td>
                                            <td class="num">{price(m.output_price_per_mtok)}</td>
                                            <td data-test-id="model-row-caps">{m.capabilities.join(", ")}</td>
                                        </tr>
                                    }).collect_view()}
                                </tbody>
                            </table>
                            <nav class="pager">
                                {(offset > 0).then(|| view! { <A href=page_link(&current, (offset - limit).max(0))>"← Previous"</A> })}
                                {(offset + limit < total).then(|| view! { <A href=page_link(&current, offset + limit)>"Next →"</A> })}
                            </nav>
                        }.into_any()
                    }
                    Err(e) => view! { <p class="error">{e.to_string()}</p> }.into_any(),
                }
            })}
        </Transition>
    }
}

#[component]
pub fn ModelPage() -> impl IntoView {
    let params = use_params_map();
    let model = Resource::new(
        move || decode(&params.read().get("id").unwrap_or_default()),
        get_catalog_model,
    );
    view! {
        <p><A href="/models">"← All models"</A></p>
        <Suspense fallback=|| view! { <p>"Loading…"</p> }>
            {move || Suspend::new(async move {
                match model.await {
                    Ok(Some(m)) => view! {
                        <article class="card" data-test-id="model-detail">
                            <h1>{m.id.clone()}</h1>
                            <dl>
                                <dt>"Provider"</dt><dd data-test-id="detail-provider">{m.provider.clone()}</dd>
                                <dt>"Mode"</dt><dd>{m.mode.clone()}</dd>
                                <dt>"Family"</dt><dd>{m.family.clone().unwrap_or_else(|| "—".into())}</dd>
                                <dt>"Context window"</dt><dd data-test-id="detail-context">{m.context_window.map(|c| format!("{c} tokens")).unwrap_or_else(|| "—".into())}</dd>
                                <dt>"Longest answer"</dt><dd>{m.max_output_tokens.map(|c| format!("{c} tokens")).unwrap_or_else(|| "—".into())}</dd>
                                <dt>"Input"</dt><dd data-test-id="detail-input-price">{format!("{} per million tokens", price(m.input_price_per_mtok))}</dd>
                                <dt>"Output"</dt><dd>{format!("{} per million tokens", price(m.output_price_per_mtok))}</dd>
                                <dt>"Capabilities"</dt><dd>{if m.capabilities.is_empty() { "—".to_string() } else { m.capabilities.join(", ") }}</dd>
                                <dt>"Retires"</dt><dd>{m.deprecation_date.clone().unwrap_or_else(|| "—".into())}</dd>
                            </dl>
                            <p class="muted">"API: "<code>{format!("GET /api/v1/models/search/{}", m.id.replace('/', "%2F"))}</code></p>
                        </article>
                    }.into_any(),
                    Ok(None) => view! { <h1>"No such model"</h1><p>"The catalogue has no model by that id."</p> }.into_any(),
                    Err(e) => view! { <p class="error">{e.to_string()}</p> }.into_any(),
                }
            })}
        </Suspense>
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prices_and_sizes_read_as_people_write_them() {
        assert_eq!(price(Some(2.5)), "$2.50");
        assert_eq!(price(Some(0.075)), "$0.075");
        assert_eq!(price(Some(0.15)), "$0.15");
        assert_eq!(price(Some(0.0)), "free");
        assert_eq!(price(None), "—");
        assert_eq!(tokens(Some(128_000)), "128k");
        assert_eq!(tokens(Some(1_048_576)), "1M");
        assert_eq!(tokens(Some(2_100_000)), "2.1M");
    }

    #[test]
    fn links_keep_the_query_and_reset_the_page() {
        assert_eq!(
            with_param("q=gpt&offset=20", "sort", "price"),
            "?q=gpt&sort=price"
        );
        assert_eq!(with_param("q=gpt&sort=price", "sort", ""), "?q=gpt");
        assert_eq!(page_link("q=gpt&offset=20", 40), "/models?q=gpt&offset=40");
        assert_eq!(decode("azure%2Fgpt-4o"), "azure/gpt-4o");
    }
}
