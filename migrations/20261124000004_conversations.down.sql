drop table proxy_requests;
drop table proxy_settings;
drop index memories_stream_idx;
alter table memories drop column stream;
create index memories_stream_idx on memories (user_id, project_id, (coalesce(agent_id, '')), seq);
drop table conversation_messages;
drop table conversations;
