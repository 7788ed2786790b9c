//! The API keys page: list (masked), create (the full key shown once, with a copy button),
//! revoke after a confirmation.
use leptos::prelude::*;

use super::{error_view, field_error, FormOutcome};
use crate::types::ApiKeyView;

#[server(prefix = "/portal/fn")]
pub async fn list_keys() -> Result<Vec<ApiKeyView>, ServerFnError> {
    use super::session::{require_user, server_error, state};
    let user = require_user().await?;
    crate::core::keys::list(&state()?.pool, user)
        .await
        .map_err(server_error)
}

#[server(prefix = "/portal/fn")]
pub async fn create_key(name: String) -> Result<FormOutcome, ServerFnError> {
    use super::session::{form_error, require_user, state};
    let user = require_user().await?;
    let name = name.trim().to_string();
    let count = name.chars().count();
    if !(1..=100).contains(&count) {
        return Ok(FormOutcome::error(
            "name",
            "Give the key a name of 1 to 100 characters",
        ));
    }
    match crate::core::keys::create(&state()?.pool, user, None, &name).await {
        Ok(key) => Ok(FormOutcome {
            secret: Some(key.key),
            message: Some(format!("Key “{name}” created")),
            ..Default::default()
        }),
        Err(e) => form_error(e, "name"),
    }
}

#[server(prefix = "/portal/fn")]
pub async fn revoke_key(id: i64) -> Result<(), ServerFnError> {
    use super::session::{require_user, server_error, state};
    let user = require_user().await?;
    let state = state()?;
    crate::core::keys::delete(&state.pool, &state.keys, user, id)
        .await
        .map_err(server_error)
}

#[component]
pub fn KeysPage() -> impl IntoView {
    let create = ServerAction::<CreateKey>::new();
    let revoke = ServerAction::<RevokeKey>::new();
    let keys = Resource::new(
        move || (create.version().get(), revoke.version().get()),
        |_| list_keys(),
    );
    let created = move || create.value().get();
    let copied = RwSignal::new(false);
    let confirming = RwSignal::new(None::<i64>);
    view! {
        <h1>"API keys"</h1>
        <p>"Agents and SDKs send a key in the "<code>"X-API-Key"</code>" header."</p>
        <section class="card">
            <h2>"New key"</h2>
            <ActionForm action=create attr:class="row">
                <input type="text" name="name" placeholder="Key name, e.g. laptop agent" required maxlength="100" data-test-id="key-name"/>
                <button type="submit" data-test-id="key-create" on:click=move |_| copied.set(false)>"Create key"</button>
            </ActionForm>
            {field_error(created, "name")}
            {move || created().and_then(|r| r.ok()).and_then(|o| o.secret).map(|secret| {
                let onclick = format!("navigator.clipboard && navigator.clipboard.writeText('{secret}')");
                view! {
                    <div class="secret" data-test-id="new-key">
                        <p><strong>"Copy this key now: it is not shown again."</strong></p>
                        <code data-test-id="new-key-value">{secret.clone()}</code>
                        <button type="button" onclick=onclick on:click=move |_| copied.set(true) data-test-id="copy-key">
                            {move || if copied.get() { "Copied" } else { "Copy" }}
                        </button>
                    </div>
                }
            })}
        </section>
        <section class="card">
            <h2>"Your keys"</h2>
            <Suspense fallback=|| view! { <p>"Loading…"</p> }>
                {move || Suspend::new(async move {
                    match keys.await {
                        Ok(list) if list.is_empty() => view! { <p data-test-id="no-keys">"No keys yet."</p> }.into_any(),
                        Ok(list) => view! {
                            <table class="list" data-test-id="keys-table">
                                <thead><tr><th>"Name"</th><th>"Key"</th><th>"Created"</th><th></th></tr></thead>
                                <tbody>
                                    {list.into_iter().map(|k| {
                                        let id = k.id;
                                        view! {
                                            <tr data-test-id="key-row">
                                                <td>{k.name.clone()}</td>
                                                <td><code data-test-id="masked-key">{k.key.clone()}</code></td>
                                                <td>{k.created_at.chars().take(10).collect::<String>()}</td>
                                                <td>
                                                    <Show when=move || confirming.get() == Some(id) fallback=move || view! {
                                                        <button type="button" class="danger" data-test-id="revoke" on:click=move |_| confirming.set(Some(id))>"Revoke"</button>
                                                    }>
                                                        <ActionForm action=revoke attr:class="inline confirm">
                                                            <span>"Revoke this key? Agents using it stop working at once."</span>
                                                            <input type="hidden" name="id" value=id/>
                                                            <button type="submit" class="danger" data-test-id="revoke-confirm">"Yes, revoke"</button>
                                                            <button type="button" on:click=move |_| confirming.set(None)>"Cancel"</button>
                                                        </ActionForm>
                                                    </Show>
                                                </td>
                                            </tr>
                                        }
                                    }).collect_view()}
                                </tbody>
                            </table>
                        }.into_any(),
                        Err(e) => error_view(e),
                    }
                })}
            </Suspense>
        </section>
    }
}
