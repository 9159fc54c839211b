-- Creates an ACTIVE run unless the id is taken.
-- KEYS[1] run hash, KEYS[2] progress list
-- ARGV[1] key TTL ms, ARGV[2] spec JSON, ARGV[3] deadline_ms, ARGV[4] max_calls,
-- ARGV[5] max_record_bytes, then (tool, cap) pairs.
-- Returns 1 created, 0 the id is taken.
if redis.call('EXISTS', KEYS[1]) == 1 then
  return 0
end
-- A progress list without its run key is a leftover of an earlier run with this id.
redis.call('DEL', KEYS[2])
redis.call('HSET', KEYS[1], 'spec', ARGV[2], 'state', 'ACTIVE', 'deadline_ms', ARGV[3],
  'max_calls', ARGV[4], 'max_record_bytes', ARGV[5], 'calls_used', 0, 'record_bytes_used', 0)
for i = 6, #ARGV, 2 do
  redis.call('HSET', KEYS[1], 'cap:' .. ARGV[i], ARGV[i + 1])
end
redis.call('PEXPIRE', KEYS[1], ARGV[1])
return 1
