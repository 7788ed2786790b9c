drop function nearest_memory_similarity(bigint, vector, int);
