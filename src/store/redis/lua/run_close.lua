-- Moves an ACTIVE run to ENDED or CANCELLED; any other state is left as it is.
-- KEYS[1] run hash; ARGV[1] the target state.
-- Returns the run hash as HGETALL does, or nil if the run is unknown.
local state = redis.call('HGET', KEYS[1], 'state')
if not state then
  return false
end
if state == 'ACTIVE' then
  redis.call('HSET', KEYS[1], 'state', ARGV[1])
end
return redis.call('HGETALL', KEYS[1])
