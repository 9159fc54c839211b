-- Atomic reservation (preflight step 10): the checks in contract order, then the record and the
-- counters, so concurrent calls can never overspend a budget or both win one tool_call_id.
-- KEYS[1] run hash, KEYS[2] record
-- ARGV[1] now_ms, ARGV[2] tool, ARGV[3] PROJECTING record JSON, ARGV[4] record TTL ms
-- Returns 0 reserved, 1 RUN_INACTIVE, 2 RUN_DEADLINE_EXCEEDED, 3 DUPLICATE_TOOL_CALL,
-- 4 BUDGET_EXHAUSTED.
-- Three commands on the way to a reservation (one or two when it is refused): the run's fields
-- in one HMGET, the duplicate check and the record in one SET NX, both counters in one HSET.
local tool = ARGV[2]
local run = redis.call('HMGET', KEYS[1], 'state', 'deadline_ms', 'calls_used', 'max_calls',
  'record_bytes_used', 'max_record_bytes', 'cap:' .. tool, 'used:' .. tool)
if run[1] ~= 'ACTIVE' then
  return 1
end
if tonumber(ARGV[1]) >= tonumber(run[2]) then
  return 2
end
local calls = tonumber(run[3])
local cap = run[7] and tonumber(run[7])
local used = tonumber(run[8] or '0')
if calls >= tonumber(run[4])
  or (cap and used >= cap)
  or tonumber(run[5]) >= tonumber(run[6]) then
  -- A duplicate id is refused as a duplicate even when the budget is spent too.
  if redis.call('EXISTS', KEYS[2]) == 1 then
    return 3
  end
  return 4
end
-- NX refuses an id that exists: then nothing is written and nothing is spent.
if not redis.call('SET', KEYS[2], ARGV[3], 'NX', 'PX', ARGV[4]) then
  return 3
end
-- The counters are the values just read, plus one: nothing else runs between the read and
-- this write. A counter never nears 2^53, where a Lua number would stop counting exactly.
redis.call('HSET', KEYS[1], 'calls_used', calls + 1, 'used:' .. tool, used + 1)
return 0
