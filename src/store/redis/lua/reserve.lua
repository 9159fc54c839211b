-- Atomic reservation (preflight step 10): the checks in contract order, then the record and the
-- counters, so concurrent calls can never overspend a budget or both win one tool_call_id.
-- KEYS[1] run hash, KEYS[2] record
-- ARGV[1] now_ms, ARGV[2] tool, ARGV[3] PROJECTING record JSON, ARGV[4] record TTL ms
-- Returns 0 reserved, 1 RUN_INACTIVE, 2 RUN_DEADLINE_EXCEEDED, 3 DUPLICATE_TOOL_CALL,
-- 4 BUDGET_EXHAUSTED.
local tool = ARGV[2]
local run = redis.call('HMGET', KEYS[1], 'state', 'deadline_ms', 'calls_used', 'max_calls',
  'record_bytes_used', 'max_record_bytes', 'cap:' .. tool, 'used:' .. tool)
if run[1] ~= 'ACTIVE' then
  return 1
end
if tonumber(ARGV[1]) >= tonumber(run[2]) then
  return 2
end
if redis.call('EXISTS', KEYS[2]) == 1 then
  return 3
end
local cap = run[7] and tonumber(run[7])
local used = tonumber(run[8] or '0')
if tonumber(run[3]) >= tonumber(run[4])
  or (cap and used >= cap)
  or tonumber(run[5]) >= tonumber(run[6]) then
  return 4
end
redis.call('SET', KEYS[2], ARGV[3], 'NX', 'PX', ARGV[4])
redis.call('HINCRBY', KEYS[1], 'calls_used', 1)
redis.call('HINCRBY', KEYS[1], 'used:' .. tool, 1)
return 0
