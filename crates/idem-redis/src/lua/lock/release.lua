-- release(lock, owner): compare-and-delete; 1 when it was ours.
local function release(lock, owner)
  if redis.call('GET', lock) == owner then
    return redis.call('DEL', lock)
  end
  return 0
end
