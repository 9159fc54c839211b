-- Compare-and-set PROJECTING -> READY | ERROR with the run's byte accounting and the progress
-- append, in one atomic step. The record JSON is written as the Rust side serialized it: it is
-- decoded here only to read its status, never re-encoded (cjson would alter numbers).
-- KEYS[1] record, KEYS[2] run hash, KEYS[3] progress list
-- ARGV[1] final record JSON, ARGV[2] its size in bytes, ARGV[3] the stripped
-- ERROR/RESULT_TOO_LARGE fallback for a run over its byte budget, ARGV[4] tool_call_id
-- Returns 0 written, 1 fallback written (run too large), 2 record missing, 3 not PROJECTING,
-- 4 run missing.
local current = redis.call('GET', KEYS[1])
if not current then
  -- Expired or lost in a failover: never recreate it.
  return 2
end
local ok, record = pcall(cjson.decode, current)
if not ok or type(record) ~= 'table' or record.status ~= 'PROJECTING' then
  return 3
end
local run = redis.call('HMGET', KEYS[2], 'record_bytes_used', 'max_record_bytes')
if not run[1] then
  return 4
end
local size = tonumber(ARGV[2])
local outcome = 0
if tonumber(run[1]) + size > tonumber(run[2]) then
  -- The fallback's bytes are not added: the run is already at its limit.
  redis.call('SET', KEYS[1], ARGV[3], 'KEEPTTL', 'XX')
  outcome = 1
else
  redis.call('HINCRBY', KEYS[2], 'record_bytes_used', size)
  redis.call('SET', KEYS[1], ARGV[1], 'KEEPTTL', 'XX')
end
if redis.call('RPUSH', KEYS[3], ARGV[4]) == 1 then
  -- A new list expires with the run key, so nothing outlives the run.
  local at = redis.call('PEXPIRETIME', KEYS[2])
  if at > 0 then
    redis.call('PEXPIREAT', KEYS[3], at)
  end
end
return outcome
