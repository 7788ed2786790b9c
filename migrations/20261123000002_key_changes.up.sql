-- Every process caching API keys' owners listens on `engram_api_keys`: a deletion or a change of
-- a key's owner (a claim moves a machine's keys to the human) notifies it when it commits.
-- Statement-level, so a deletion of many keys sends one notification; `last_used_at` updates do
-- not notify.
create function notify_api_key_change() returns trigger
language plpgsql as $$
begin
    perform pg_notify('engram_api_keys', '');
    return null;
end
$$;

create trigger api_keys_changed
    after update of user_id, machine_id, key_hash or delete or truncate on api_keys
    for each statement execute function notify_api_key_change();
