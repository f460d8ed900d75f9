import os, tempfile, clattn
run = tempfile.mkdtemp()
trainer = clattn.Trainer("lm", data="../shared/data/tinyshakespeare/input.txt", attention="full",
                         layers=2, dim=64, heads=2, seq=64, batch=8, steps=40, warmup=5, lr=3e-3,
                         eval_every=40, eval_examples=32, checkpoint=run)
trainer.run()                                                # checkpoints in run/best and run/latest
model = clattn.load_model(os.path.join(run, "best"))         # config, weights and tokenizer.json
print("ROMEO:" + model.generate("ROMEO:", 50, temperature=0.8, seed=1))   # the continuation
