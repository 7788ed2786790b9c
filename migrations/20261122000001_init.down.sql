drop table if exists sessions, dev_mailbox, claims, memories, tasks, projects, api_key_usage, api_keys, users cascade;
