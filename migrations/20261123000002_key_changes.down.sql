drop trigger if exists api_keys_changed on api_keys;
drop function if exists notify_api_key_change();
