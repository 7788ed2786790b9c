drop table if exists rate_limits;
