// GPU buffers created and destroyed on one GPUDevice, counted exactly.
//
// Contract: countBuffers(device) wraps the device's createBuffer (on the instance) and the destroy() of every
// buffer that device creates, before any runtime uses it. Every buffer the runtime creates through that device
// is counted once when created and once when destroyed (a second destroy() of the same buffer is not counted
// again). A buffer only garbage-collected, never destroyed, stays "live" here. snapshot() copies the counters;
// delta(a, b) is what happened between two snapshots. Buffers are classed by usage: storage (tensors), uniform
// (kernel parameters), staging (MAP_READ / MAP_WRITE: host copies), other.

const MAP_READ = 0x1;
const MAP_WRITE = 0x2;
const UNIFORM = 0x40;
const STORAGE = 0x80;

export const CLASSES = ['storage', 'uniform', 'staging', 'other'];

function usageClass(usage) {
  if (usage & STORAGE) return 'storage';
  if (usage & UNIFORM) return 'uniform';
  if (usage & (MAP_READ | MAP_WRITE)) return 'staging';
  return 'other';
}

export function countBuffers(device) {
  if (device.__kvlabCounters) return device.__kvlabCounters;
  const counts = { created: 0, destroyed: 0, bytes_created: 0, bytes_destroyed: 0, live: 0, live_bytes: 0 };
  for (const k of CLASSES) counts[`${k}_created`] = 0;
  const create = device.createBuffer;
  device.createBuffer = function createBufferCounted(descriptor) {
    const buffer = create.call(this, descriptor);
    const size = Number(descriptor.size);
    counts.created += 1;
    counts.bytes_created += size;
    counts.live += 1;
    counts.live_bytes += size;
    counts[`${usageClass(descriptor.usage)}_created`] += 1;
    let destroyed = false;
    const destroy = buffer.destroy;
    buffer.destroy = function destroyCounted() {
      if (!destroyed) {
        destroyed = true;
        counts.destroyed += 1;
        counts.bytes_destroyed += size;
        counts.live -= 1;
        counts.live_bytes -= size;
      }
      return destroy.call(this);
    };
    return buffer;
  };
  const counters = {
    snapshot: () => ({ ...counts }),
    delta(a, b) {
      const d = {};
      for (const k of Object.keys(a)) d[k] = b[k] - a[k];
      d.live = b.live;
      d.live_bytes = b.live_bytes;
      return d;
    },
  };
  device.__kvlabCounters = counters;
  return counters;
}
