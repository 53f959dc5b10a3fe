// What the page runs in, in words.
//
// Contract: browserHost() is the host record a result carries ({kind: 'browser', name, user_agent, headless});
// browserName() resolves to e.g. "Chromium 156.0.8078.114", "Google Chrome 140.0.7339.80",
// "Firefox 145.0", "Safari 26.0": the brand and its full version where the browser tells them
// (navigator.userAgentData), else read from the user agent string.

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
