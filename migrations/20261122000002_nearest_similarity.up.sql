-- Novelty for the importance score: the cosine similarity of the account's memory nearest to a
-- new one. Small accounts are compared exactly; larger ones through the HNSW index, which the
-- connection settings scan iteratively so the account filter never leaves it empty. The SET
-- clauses keep the planner on those paths when the table's statistics are stale or missing (a
-- new table, or autovacuum off): measured without them, it sorted the whole account by distance
-- for every new memory (15.7 ms each at 10,000 memories instead of under 1 ms).
create function nearest_memory_similarity(account bigint, query vector, exact_limit int)
returns real
language plpgsql stable
set enable_seqscan = off
set enable_sort = off
as $$
begin
    if (select count(*) from (select 1 from memories where user_id = account limit exact_limit + 1) s)
        <= exact_limit then
        return (select max(1 - (embedding <=> query)) from memories where user_id = account);
    end if;
    return (select 1 - (embedding <=> query) from memories where user_id = account
            order by embedding <=> query limit 1);
end
$$;
