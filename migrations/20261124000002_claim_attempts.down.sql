drop table claim_attempts;
