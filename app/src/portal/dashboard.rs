//! The dashboard (the landing page after log-in) and the plan page. Charts are SVG drawn on the
//! server with the page: readable without JavaScript, each with a text title and each bar with
//! its figure (a `<title>` a screen reader or a hover shows, and `data-value`).
use leptos::prelude::*;
use leptos_router::components::A;
use serde::{Deserialize, Serialize};

use super::error_view;
use crate::types::{AccountStats, SubscriptionStatus, UsageHistory};

/// What the dashboard shows.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct DashboardData {
    pub stats: AccountStats,
    pub usage: UsageHistory,
}

/// Days the dashboard's charts cover.
pub const DASHBOARD_DAYS: i64 = 30;

#[server(prefix = "/portal/fn")]
pub async fn dashboard() -> Result<DashboardData, ServerFnError> {
    use super::session::{require_user, server_error, state};
    let user = require_user().await?;
    let state = state()?;
    let (stats, usage) = futures::try_join!(
        crate::core::stats::account(&state.pool, &state.stats, user),
        crate::core::stats::history(&state.pool, &state.stats, user, DASHBOARD_DAYS),
    )
    .map_err(server_error)?;
    Ok(DashboardData { stats, usage })
}

#[server(prefix = "/portal/fn")]
pub async fn plan_status() -> Result<SubscriptionStatus, ServerFnError> {
    use super::session::{require_user, server_error, state};
    let user = require_user().await?;
    crate::core::plans::subscription(&state()?, user)
        .await
        .map_err(server_error)
}

/// `12,345`.
pub fn group_digits(n: i64) -> String {
    let digits = n.unsigned_abs().to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    if n < 0 {
        format!("-{out}")
    } else {
        out
    }
}

/// A column per day. `points`: (date, value).
#[component]
fn DailyChart(
    title: String,
    test_id: String,
    unit: String,
    points: Vec<(String, i64)>,
) -> impl IntoView {
    const W: f64 = 600.0;
    const H: f64 = 150.0;
    const TOP: f64 = 16.0;
    let max = points.iter().map(|p| p.1).max().unwrap_or(0).max(1);
    let n = points.len().max(1) as f64;
    let step = W / n;
    let total: i64 = points.iter().map(|p| p.1).sum();
    let first = points.first().map(|p| p.0.clone()).unwrap_or_default();
    let last = points.last().map(|p| p.0.clone()).unwrap_or_default();
    let summary = format!(
        "{title}: {} {unit} over {} days, at most {} a day",
        group_digits(total),
        points.len(),
        group_digits(max)
    );
    let title_id = format!("{test_id}-title");
    let desc = summary.clone();
    let bars = points
        .into_iter()
        .enumerate()
        .map(|(i, (date, v))| {
            let h = (v as f64 / max as f64) * (H - TOP);
            let x = i as f64 * step + step * 0.15;
            let label = format!("{date}: {} {unit}", group_digits(v));
            view! {
                <rect class="bar" x=format!("{x:.1}") y=format!("{:.1}", H - h) width=format!("{:.1}", step * 0.7)
                    height=format!("{h:.1}") data-date=date data-value=v.to_string()>
                    <title>{label}</title>
                </rect>
            }
        })
        .collect_view();
    view! {
        <figure class="chart" data-test-id=test_id.clone() data-total=total.to_string()>
            <figcaption id=title_id.clone()>{title.clone()}</figcaption>
            <svg viewBox=format!("0 -4 {W} {}", H + 24.0) role="img" aria-labelledby=title_id aria-label=summary
                preserveAspectRatio="none" class="chart-svg">
                <desc>{desc}</desc>
                <line class="axis" x1="0" y1=H.to_string() x2=W.to_string() y2=H.to_string()/>
                <text class="tick" x="0" y="10">{group_digits(max)}</text>
                {bars}
                <text class="tick" x="0" y=format!("{}", H + 16.0)>{first}</text>
                <text class="tick" x=W.to_string() y=format!("{}", H + 16.0) text-anchor="end">{last}</text>
            </svg>
        </figure>
    }
}

/// A horizontal bar per label. `rows`: (label, value).
#[component]
fn BarList(
    title: String,
    test_id: String,
    unit: String,
    rows: Vec<(String, i64)>,
) -> impl IntoView {
    const W: f64 = 380.0;
    const ROW: f64 = 26.0;
    const LABEL: f64 = 100.0;
    let max = rows.iter().map(|r| r.1).max().unwrap_or(0).max(1);
    let height = ROW * rows.len().max(1) as f64;
    let title_id = format!("{test_id}-title");
    let summary = rows
        .iter()
        .map(|(l, v)| format!("{l}: {}", group_digits(*v)))
        .collect::<Vec<_>>()
        .join(", ");
    let desc = summary.clone();
    let bars = rows
        .into_iter()
        .enumerate()
        .map(|(i, (label, v))| {
            let y = i as f64 * ROW;
            let w = (v as f64 / max as f64) * (W - LABEL - 60.0);
            let text = format!("{label}: {} {unit}", group_digits(v));
            let label_attr = label.clone();
            view! {
                <g class="bar-row" data-label=label_attr data-value=v.to_string()>
                    <title>{text}</title>
                    <text class="label" x="0" y=format!("{:.1}", y + 17.0)>{label}</text>
                    <rect class="bar" x=LABEL.to_string() y=format!("{:.1}", y + 4.0) width=format!("{w:.1}") height="18"/>
                    <text class="value" x=format!("{:.1}", LABEL + w + 6.0) y=format!("{:.1}", y + 17.0)>{group_digits(v)}</text>
                </g>
            }
        })
        .collect_view();
    view! {
        <figure class="chart" data-test-id=test_id>
            <figcaption id=title_id.clone()>{title}</figcaption>
            <svg viewBox=format!("0 0 {W} {height}") role="img" aria-labelledby=title_id aria-label=summary class="chart-svg">
                <desc>{desc}</desc>
                {bars}
            </svg>
        </figure>
    }
}

#[component]
fn Figure(label: &'static str, value: String, test_id: &'static str) -> impl IntoView {
    view! {
        <div class="figure">
            <span class="figure-value" data-test-id=test_id>{value}</span>
            <span class="figure-label">{label}</span>
        </div>
    }
}

#[component]
pub fn DashboardPage() -> impl IntoView {
    let data = Resource::new(|| (), |_| dashboard());
    view! {
        <h1>"Dashboard"</h1>
        <Suspense fallback=|| view! { <p>"Loading…"</p> }>
            {move || Suspend::new(async move {
                match data.await {
                    Ok(d) => dashboard_view(d).into_any(),
                    Err(e) => error_view(e),
                }
            })}
        </Suspense>
    }
}

fn dashboard_view(d: DashboardData) -> impl IntoView {
    let s = d.stats;
    let days = d.usage.daily;
    let memories: Vec<(String, i64)> = days
        .iter()
        .map(|u| (u.date.clone(), u.memories_created))
        .collect();
    let calls: Vec<(String, i64)> = days.iter().map(|u| (u.date.clone(), u.calls)).collect();
    let sectors: Vec<(String, i64)> = s
        .sectors
        .iter()
        .map(|c| (c.sector.clone(), c.memories))
        .collect();
    let projects: Vec<(String, i64)> = s
        .top_projects
        .iter()
        .map(|p| (p.name.clone(), p.memories))
        .collect();
    let completed: i64 = days.iter().map(|u| u.tasks_completed).sum();
    let failed: i64 = days.iter().map(|u| u.tasks_failed).sum();
    let searches: i64 = days.iter().map(|u| u.searches).sum();
    let latest_p50 = days
        .iter()
        .rev()
        .find_map(|u| u.task_p50_ms.map(|m| (u.date.clone(), m)));
    let search_p50 = days
        .iter()
        .rev()
        .find_map(|u| u.search_p50_ms.map(|m| (u.date.clone(), m)));
    let health = if failed == 0 { "ok" } else { "warn" };
    view! {
        <section class="figures" data-test-id="totals">
            <Figure label="memories" value=group_digits(s.total_memories) test_id="total-memories"/>
            <Figure label="queued" value=group_digits(s.tasks_pending) test_id="tasks-pending"/>
            <Figure label="projects" value=group_digits(s.total_projects) test_id="total-projects"/>
            <Figure label="conversations" value=group_digits(s.total_conversations) test_id="total-conversations"/>
            <Figure label="API keys" value=group_digits(s.total_api_keys) test_id="total-api-keys"/>
            <Figure label="machines claimed" value=group_digits(s.machines_claimed) test_id="machines-claimed"/>
            <Figure label="stored" value=s.storage_used.clone() test_id="storage-used"/>
            <Figure label="API calls today" value=group_digits(s.api_calls_today) test_id="api-calls-today"/>
            <Figure label="API calls this month" value=group_digits(s.api_calls_this_month) test_id="api-calls-month"/>
        </section>
        <p class="muted">"Plan: "<A href="/plan">{s.plan.clone()}</A>" · the last 30 days, UTC · "<a href="/api/stats/usage?days=30">"as JSON"</a></p>
        <section class="card">
            <DailyChart title="Memories created per day".into() test_id="chart-memories".into() unit="memories".into() points=memories/>
            <DailyChart title="API calls per day".into() test_id="chart-calls".into() unit="calls".into() points=calls/>
        </section>
        <div class="two">
            <section class="card">
                <BarList title="Memories by sector".into() test_id="chart-sectors".into() unit="memories".into() rows=sectors/>
            </section>
            <section class="card">
                {if projects.is_empty() {
                    view! { <p>"No projects."</p> }.into_any()
                } else {
                    view! { <BarList title="Projects by size".into() test_id="chart-projects".into() unit="memories".into() rows=projects/> }.into_any()
                }}
            </section>
        </div>
        <section class="card" data-test-id="task-health" data-health=health>
            <h2>"Task health (30 days)"</h2>
            <ul class="plain">
                <li><strong data-test-id="tasks-completed">{group_digits(completed)}</strong>" completed, "
                    <strong data-test-id="tasks-failed" class={if failed > 0 { "danger" } else { "" }}>{group_digits(failed)}</strong>" failed, "
                    <strong>{group_digits(s.tasks_pending)}</strong>" waiting now"</li>
                <li>{match latest_p50 {
                    Some((day, ms)) => format!("Median time from POST to stored: {ms:.0} ms ({day})"),
                    None => "No task completed in these 30 days.".to_string(),
                }}</li>
                <li>{format!("{} searches", group_digits(searches))}{search_p50.map(|(day, ms)| format!(", median {ms:.1} ms ({day})"))}</li>
            </ul>
        </section>
    }
}

#[component]
pub fn PlanPage() -> impl IntoView {
    let data = Resource::new(|| (), |_| plan_status());
    view! {
        <h1>"Your plan"</h1>
        <Suspense fallback=|| view! { <p>"Loading…"</p> }>
            {move || Suspend::new(async move {
                match data.await {
                    Ok(s) => plan_view(s).into_any(),
                    Err(e) => error_view(e),
                }
            })}
        </Suspense>
    }
}

fn plan_view(s: SubscriptionStatus) -> impl IntoView {
    let current = s.plan.name.clone();
    let limit_text = |l: Option<i64>| l.map(group_digits).unwrap_or_else(|| "unlimited".into());
    let bars = s
        .quotas
        .iter()
        .map(|q| {
            let pct = q.limit.map(|l| if l == 0 { 100.0 } else { (q.used as f64 / l as f64 * 100.0).min(100.0) });
            let warn = pct.is_some_and(|p| p >= 80.0);
            let full = q.limit.is_some_and(|l| q.used >= l);
            let text = match q.limit {
                Some(l) => format!("{} of {}", group_digits(q.used), group_digits(l)),
                None => format!("{} (unlimited)", group_digits(q.used)),
            };
            let class = if full { "usage full" } else if warn { "usage warn" } else { "usage" };
            view! {
                <li class=class data-test-id=format!("quota-{}", q.quota) data-used=q.used.to_string()
                    data-limit=q.limit.map(|l| l.to_string()).unwrap_or_default()>
                    <div class="usage-head">
                        <span class="usage-label">{q.label.clone()}</span>
                        <span class="usage-text" data-test-id=format!("quota-{}-text", q.quota)>{text}</span>
                    </div>
                    {pct.map(|p| view! {
                        <div class="usage-track" role="progressbar" aria-label=q.label.clone()
                            aria-valuemin="0" aria-valuemax="100" aria-valuenow=format!("{p:.0}")>
                            <div class="usage-fill" style=format!("width: {p:.1}%")></div>
                        </div>
                    })}
                    {warn.then(|| view! {
                        <p class="usage-warning" data-test-id=format!("quota-{}-warning", q.quota)>
                            {if full { "Used up: requests that need more are refused (402).".to_string() }
                             else { format!("{:.0} % used.", pct.unwrap_or(0.0)) }}
                        </p>
                    })}
                    {q.resets_at.clone().map(|r| view! { <p class="muted small">{format!("Starts again {} UTC", r.replace('T', " ").chars().take(16).collect::<String>())}</p> })}
                </li>
            }
        })
        .collect_view();
    let plans = s
        .plans
        .iter()
        .map(|p| {
            let l = &p.limits;
            let this = p.name == current;
            view! {
                <tr class=if this { "current" } else { "" } data-test-id=format!("plan-{}", p.name)>
                    <td><strong>{p.display_name.clone()}</strong>{this.then_some(" (yours)")}<br/><span class="muted small">{p.name.clone()}</span></td>
                    <td>{p.price_label.clone()}</td>
                    <td>{limit_text(l.memories)}</td>
                    <td>{limit_text(l.api_calls_per_month)}</td>
                    <td>{limit_text(l.searches_per_day)}</td>
                    <td>{limit_text(l.proxy_tokens_per_month)}</td>
                    <td>{limit_text(l.projects)}</td>
                    <td>{limit_text(l.machines)}</td>
                </tr>
            }
        })
        .collect_view();
    let how = match (&s.billing.checkout_url, &s.billing.contact) {
        (Some(url), _) => view! { <p>"Change your plan at "<a href=url.clone() data-test-id="checkout">"the checkout page"</a>"."</p> }.into_any(),
        (None, Some(who)) => view! { <p data-test-id="contact">{format!("To change your plan, ask {who}.")}</p> }.into_any(),
        (None, None) => view! { <p data-test-id="contact">"To change your plan, ask the operator of this server (`engram plan assign`)."</p> }.into_any(),
    };
    view! {
        <section class="card">
            <h2 data-test-id="plan-name" data-plan=current.clone()>{format!("{} ({})", s.plan.display_name, s.plan.price_label)}</h2>
            {s.plan_until.clone().map(|u| view! { <p class="muted">{format!("Until {}, then the default plan.", u.replace('T', " ").chars().take(16).collect::<String>())}</p> })}
            <ul class="usages">{bars}</ul>
        </section>
        <section class="card">
            <h2>"Plans"</h2>
            <table class="plans">
                <thead><tr><th>"Plan"</th><th>"Price"</th><th>"Memories"</th><th>"API calls / month"</th><th>"Searches / day"</th><th>"Proxy tokens / month"</th><th>"Projects"</th><th>"Machines"</th></tr></thead>
                <tbody>{plans}</tbody>
            </table>
            {how}
        </section>
    }
}
