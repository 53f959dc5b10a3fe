// What the page runs in, in words.
//
// Contract: browserHost() is the host record a result carries ({kind: 'browser', name, user_agent, headless});
// browserName() resolves to e.g. "Chromium 156.0.8078.114", "Google Chrome 140.0.7339.80",
// "Firefox 145.0", "Safari 26.0": the brand and its full version where the browser tells them
// (navigator.userAgentData), else read from the user agent string. openAdapter(gpu) resolves to gpu's
// high-performance adapter and its GPUAdapter.info in kvlab's words ({vendor, architecture, device, description,
// is_fallback, features, max_buffer_size}); it throws when there is no navigator.gpu or no adapter.
// describeBrowser() never throws: {user_agent, name, webgpu: whether navigator.gpu exists, and either adapter
// (openAdapter's info) or error (why there is none)}. reportBrowser(model) sets a widget's synced trait `browser`
// to that answer and saves it, so the kernel holds it, unless a view already did.

export async function browserName() {
  const data = navigator.userAgentData;
  if (data) {
    let brands = data.brands;
    try {
      brands = (await data.getHighEntropyValues(['fullVersionList'])).fullVersionList ?? brands;
    } catch {
      // low-entropy brands only
    }
    const real = brands.filter((b) => !/^Not.A.Brand/i.test(b.brand));
    const brand = real.find((b) => b.brand !== 'Chromium') ?? real[0];
    if (brand) return `${brand.brand} ${brand.version}`;
  }
  const m = navigator.userAgent.match(/(Firefox|Edg|Chrome|Version)\/([\d.]+)/);
  return m ? `${m[1] === 'Version' ? 'Safari' : m[1]} ${m[2]}` : navigator.userAgent;
}

export async function browserHost() {
  const ua = navigator.userAgent;
  return { kind: 'browser', name: await browserName(), user_agent: ua, headless: /Headless/.test(ua) };
}

export async function openAdapter(gpu) {
  if (!gpu) throw new Error('this host has no navigator.gpu: WebGPU is not available here');
  const adapter = await gpu.requestAdapter({ powerPreference: 'high-performance' });
  if (!adapter) throw new Error('navigator.gpu.requestAdapter() returned no adapter: WebGPU has no device here');
  const info = adapter.info ?? {};
  const adapterInfo = {
    vendor: info.vendor ?? '',
    architecture: info.architecture ?? '',
    device: info.device ?? '',
    description: info.description ?? '',
    is_fallback: info.isFallbackAdapter ?? adapter.isFallbackAdapter ?? null,
    features: [...adapter.features].sort(),
    max_buffer_size: Number(adapter.limits.maxBufferSize),
  };
  return { adapter, adapterInfo };
}

export async function describeBrowser() {
  const out = { user_agent: navigator.userAgent, name: await browserName(), webgpu: Boolean(navigator.gpu) };
  if (!navigator.gpu) return out;
  try {
    const { adapterInfo } = await openAdapter(navigator.gpu);
    out.adapter = adapterInfo;
  } catch (err) {
    out.error = `${err?.message ?? err}`;
  }
  return out;
}

export function reportBrowser(model) {
  if (model.get('browser')?.name) return;
  describeBrowser().then((b) => {
    model.set('browser', b);
    model.save_changes();
  });
}
