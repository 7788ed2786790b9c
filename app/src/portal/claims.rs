//! Claiming a machine from the portal (the code from the e-mail, entered while logged in as the
//! e-mail's account), the machines claimed into the account, and the development mailbox.
use leptos::prelude::*;
use leptos_router::components::A;
use leptos_router::hooks::use_query_map;

use super::{error_view, field_error, FormOutcome};
use crate::types::{MachineView, MailView, PendingClaim};

#[derive(Clone, Debug, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct ClaimOverview {
    pub pending: Vec<PendingClaim>,
    pub machines: Vec<MachineView>,
}

#[server(prefix = "/portal/fn")]
pub async fn claim_page_data() -> Result<ClaimOverview, ServerFnError> {
    use super::session::{require_user, server_error, state};
    let user = require_user().await?;
    let pool = state()?.pool.clone();
    let pending = crate::core::claims::pending_for(&pool, user)
        .await
        .map_err(server_error)?;
    let machines = crate::core::machines::claimed_into(&pool, user)
        .await
        .map_err(server_error)?;
    Ok(ClaimOverview { pending, machines })
}

#[server(prefix = "/portal/fn")]
pub async fn confirm_claim(machine_id: i64, code: String) -> Result<FormOutcome, ServerFnError> {
    use super::session::{form_error, require_user, state};
    use crate::core::claims::{verify, ClaimRef};
    let user = require_user().await?;
    let code = code.trim().to_string();
    if code.len() != 6 || !code.chars().all(|c| c.is_ascii_digit()) {
        return Ok(FormOutcome::error(
            "code",
            "The code is the 6 digits from the e-mail",
        ));
    }
    let state = state()?;
    match verify(
        &state,
        ClaimRef::ForHuman {
            machine_id,
            human_id: user,
        },
        &code,
    )
    .await
    {
        Ok(_) => Ok(FormOutcome::message(
            "The machine and its memories are now in your account",
        )),
        Err(e) => form_error(e, "code"),
    }
}

#[server(prefix = "/portal/fn")]
pub async fn mailbox() -> Result<Vec<MailView>, ServerFnError> {
    use super::session::{require_user, server_error, state};
    require_user().await?;
    let state = state()?;
    if state.settings.production {
        return Err(ServerFnError::new(
            "The development mailbox exists only in development mode",
        ));
    }
    crate::core::mail::dev_mailbox(&state.pool)
        .await
        .map_err(server_error)
}

#[component]
pub fn ClaimPage() -> impl IntoView {
    let confirm = ServerAction::<ConfirmClaim>::new();
    let data = Resource::new(move || confirm.version().get(), |_| claim_page_data());
    let query = use_query_map();
    let wanted = move || {
        query
            .read()
            .get("machine")
            .and_then(|m| m.parse::<i64>().ok())
    };
    let result = move || confirm.value().get();
    view! {
        <h1>"Machines"</h1>
        {move || result().and_then(|r| r.ok()).and_then(|o| o.message).map(|m| view! { <p class="notice" data-test-id="claim-done">{m}" "<A href="/projects">"See your projects"</A></p> })}
        <Suspense fallback=|| view! { <p>"Loading…"</p> }>
            {move || Suspend::new(async move {
                match data.await {
                    Ok(d) => {
                        let wanted = wanted();
                        view! {
                            <section class="card">
                                <h2>"Claim a machine"</h2>
                                {if d.pending.is_empty() {
                                    view! { <p data-test-id="no-claims">"No claim is waiting for you. An agent starts one with "<code>"POST /api/v1/agents/claim/init"</code>" and your e-mail."</p> }.into_any()
                                } else {
                                    d.pending.into_iter().map(|p| {
                                        let highlight = wanted == Some(p.machine_id);
                                        view! {
                                            <div class=if highlight { "claim highlight" } else { "claim" } data-test-id="pending-claim">
                                                <p>
                                                    <strong>{p.hostname.clone().unwrap_or_else(|| "unnamed machine".into())}</strong>
                                                    " ("{p.platform.clone().unwrap_or_else(|| "unknown platform".into())}")"
                                                </p>
                                                <p data-test-id="claim-moves">{format!("{} project(s) and {} memory(ies) will move into your account, with the machine's API keys.", p.projects, p.memories)}</p>
                                                <ActionForm action=confirm attr:class="row">
                                                    <input type="hidden" name="machine_id" value=p.machine_id/>
                                                    <input type="text" name="code" inputmode="numeric" pattern="[0-9]{6}" maxlength="6" placeholder="6-digit code" required data-test-id="claim-code"/>
                                                    <button type="submit" data-test-id="claim-confirm">"Confirm the claim"</button>
                                                </ActionForm>
                                            </div>
                                        }
                                    }).collect_view().into_any()
                                }}
                                {field_error(result, "code")}
                            </section>
                            <section class="card">
                                <h2>"Claimed machines"</h2>
                                {if d.machines.is_empty() {
                                    view! { <p>"None yet."</p> }.into_any()
                                } else {
                                    view! {
                                        <table class="list" data-test-id="machines">
                                            <thead><tr><th>"Machine"</th><th>"Platform"</th><th>"Registered"</th><th>"Claimed"</th></tr></thead>
                                            <tbody>
                                                {d.machines.into_iter().map(|m| view! {
                                                    <tr data-test-id="machine-row">
                                                        <td>{m.hostname.unwrap_or_else(|| format!("machine {}", m.user_id))}</td>
                                                        <td>{m.platform.unwrap_or_default()}</td>
                                                        <td>{m.created_at.chars().take(10).collect::<String>()}</td>
                                                        <td>{m.claimed_at.unwrap_or_default().chars().take(10).collect::<String>()}</td>
                                                    </tr>
                                                }).collect_view()}
                                            </tbody>
                                        </table>
                                    }.into_any()
                                }}
                            </section>
                        }.into_any()
                    }
                    Err(e) => error_view(e),
                }
            })}
        </Suspense>
    }
}

#[component]
pub fn MailboxPage() -> impl IntoView {
    let mails = Resource::new(|| (), |_| mailbox());
    view! {
        <h1>"Development mailbox"</h1>
        <p class="muted">"No SMTP server is configured: messages are kept here instead of being sent."</p>
        <Suspense fallback=|| view! { <p>"Loading…"</p> }>
            {move || Suspend::new(async move {
                match mails.await {
                    Ok(list) if list.is_empty() => view! { <p>"No messages."</p> }.into_any(),
                    Ok(list) => list.into_iter().map(|m| view! {
                        <article class="card mail" data-test-id="mail">
                            <p><strong>{m.subject.clone()}</strong></p>
                            <p class="muted">{format!("To {} · {}", m.to_address, m.created_at)}</p>
                            <pre data-test-id="mail-body">{m.text_body.clone()}</pre>
                        </article>
                    }).collect_view().into_any(),
                    Err(e) => error_view(e),
                }
            })}
        </Suspense>
    }
}
