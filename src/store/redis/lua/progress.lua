-- Resolves a run's progress list through its records in one atomic read. Never touches a TTL.
-- KEYS[1] run hash, KEYS[2] progress list
-- ARGV[1] the record key of the run without the tool_call_id (all in the run's hash slot)
-- Returns nil if the run is unknown, else {id1, record1 or nil, id2, record2 or nil, ...}.
if redis.call('EXISTS', KEYS[1]) == 0 then
  return false
end
local ids = redis.call('LRANGE', KEYS[2], 0, -1)
local out = {}
for i, id in ipairs(ids) do
  out[2 * i - 1] = id
  out[2 * i] = redis.call('GET', ARGV[1] .. id)
end
return out
