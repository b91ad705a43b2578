// ipywidgets' controls typeset their labels with MathJax 2's API (MathJax.Hub.Queue); the site
// loads MathJax 3. Before the widget manager renders (its DOMContentLoaded listener is added
// after this one), map that call onto MathJax 3's typesetPromise.
document.addEventListener("DOMContentLoaded", function () {
  var mj = window.MathJax;
  if (!mj || mj.Hub) {
    return;
  }
  mj.Hub = {
    Queue: function (job) {
      var element = job && job[2];
      var m = window.MathJax;
      var run = function () {
        if (m.typesetPromise) {
          m.typesetPromise(element ? [element] : undefined).catch(function () {});
        }
      };
      if (m.startup && m.startup.promise) {
        m.startup.promise.then(run);
      } else {
        run();
      }
    },
  };
});
