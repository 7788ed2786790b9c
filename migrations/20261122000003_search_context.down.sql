alter table memories alter column embedding set storage external;
drop function memory_vector_candidates(bigint, text, vector, int);
drop index memories_user_day_idx;
alter table memories drop column event_day;
drop index memories_stream_idx;
alter table memories drop column seq;
alter table tasks drop column seq;
drop sequence memory_seq;
