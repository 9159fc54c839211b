-- Compare-and-set PROJECTING -> READY | ERROR with the run's byte accounting and the progress
-- append, in one atomic step. The record JSON is written as the Rust side serialized it, never
-- decoded and re-encoded here (cjson would alter numbers and key order).
-- KEYS[1] record, KEYS[2] run hash, KEYS[3] progress list
-- ARGV[1] final record JSON, ARGV[2] its size in bytes, ARGV[3] where to splice ARGV[1] into
-- its stripped ERROR/RESULT_TOO_LARGE form for a run over its byte budget: five byte offsets
-- (the "," before status, request, raw_response, upstream_status and request_sha256), or empty
-- when ARGV[1] is stripped already; ARGV[4] tool_call_id; ARGV[5] the stripped form's own
-- digests and seal, which end it (sealed by toolgate: this script cannot), or empty when
-- toolgate has not made them yet
-- Returns 0 written, 1 fallback written (run too large), 2 record missing, 3 not PROJECTING,
-- 4 run missing, 5 the fallback is needed and ARGV[5] is empty: nothing was written, call again
-- with the stripped form's tail.
local current = redis.call('GET', KEYS[1])
if not current then
  -- Expired or lost in a failover: never recreate it.
  return 2
end
-- The stored status is the first `,"status":"` of the record: the fields before it are a
-- number and JSON strings, in which a quote is always escaped.
local at = string.find(current, ',"status":"', 1, true)
if not at or string.sub(current, at + 11, at + 21) ~= 'PROJECTING"' then
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
  local body = ARGV[1]
  if ARGV[3] ~= '' then
    if ARGV[5] == '' then
      return 5
    end
    local s, r, a, u, d = string.match(ARGV[3], '^(%d+) (%d+) (%d+) (%d+) (%d+)$')
    s, r, a, u, d = tonumber(s), tonumber(r), tonumber(a), tonumber(u), tonumber(d)
    body = string.sub(body, 1, s)
      .. ',"status":"ERROR","evidence_status":"ERROR"'
      .. string.sub(body, r + 1, a)
      .. ',"raw_response":null,"agent_result":null,"error_code":"RESULT_TOO_LARGE"'
      .. string.sub(body, u + 1, d)
      .. ARGV[5]
  end
  redis.call('SET', KEYS[1], body, 'KEEPTTL', 'XX')
  outcome = 1
else
  redis.call('HINCRBY', KEYS[2], 'record_bytes_used', size)
  redis.call('SET', KEYS[1], ARGV[1], 'KEEPTTL', 'XX')
end
if redis.call('RPUSH', KEYS[3], ARGV[4]) == 1 then
  -- A new list expires with the run key, so nothing outlives the run.
  local expires = redis.call('PEXPIRETIME', KEYS[2])
  if expires > 0 then
    redis.call('PEXPIREAT', KEYS[3], expires)
  end
end
return outcome
